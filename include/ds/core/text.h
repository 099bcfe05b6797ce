#pragma once
// Small text helpers for reading user files and for quoting user input in error messages.
//
//   quoted_excerpt(bytes, max)   'bytes' in single quotes, at most `max` characters of it, with
//                                control characters, backslashes, quotes and invalid UTF-8 escaped
//                                (\n, \t, \xNN) and "... (N bytes in all)" after a cut: safe to
//                                print whatever the input was (binary, 50 MB, half a character)
//   strip_utf8_bom(text)         text without a leading UTF-8 byte order mark (EF BB BF)
//   iequals(a, b)                ASCII case-insensitive equality (host names, header names)
//
// Pure functions; thread-safe.
#include <cstddef>
#include <string>
#include <string_view>

namespace ds {

std::string quoted_excerpt(std::string_view bytes, size_t max_chars = 200);
std::string_view strip_utf8_bom(std::string_view text);
bool iequals(std::string_view a, std::string_view b);

}  // namespace ds
