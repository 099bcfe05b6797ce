#pragma once
// GPT-2's merges file (vocab.bpe, merges.txt): one "a b" pair per line in rank order, an optional
// "#version" first line, CRLF line ends tolerated. Internal to data/: both BPE tokenizers read it.
#include <cstddef>
#include <filesystem>
#include <string_view>

#include "ds/core/error.h"

namespace ds::data::detail {

// Calls fn(line_no, a, b) for each pair, in file order; a line that is not two tokens separated by
// one space is an error naming `path` and the line.
template <class Fn>
void for_each_merge_line(std::string_view text, const std::filesystem::path& path, Fn&& fn) {
  std::string_view rest = text;
  size_t line_no = 0;
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view{} : rest.substr(nl + 1);
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    const size_t sp = line.find(' ');
    DS_CHECK(sp != std::string_view::npos && sp > 0 && sp + 1 < line.size() &&
                 line.find(' ', sp + 1) == std::string_view::npos,
             "[tokenizer] '{}' line {}: expected two tokens separated by one space, got '{}'",
             path.string(), line_no, line);
    fn(line_no, line.substr(0, sp), line.substr(sp + 1));
  }
}

}  // namespace ds::data::detail
