// Lenient JSON loading for DeepSpeed configs (comments, trailing commas) and the small text helpers
// the parser's messages need (edit distance, value display).
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "config_internal.h"
#include "ds/core/error.h"
#include "ds/core/json_text.h"

namespace ds::config {

using detail::json;

std::string strip_trailing_commas(std::string_view text) {
  // A small scanner that knows strings (with escapes) and both comment forms, so a comma inside
  // either is never touched. A comma is dropped when the next significant character closes an
  // object or array.
  std::string out;
  out.reserve(text.size());
  const size_t n = text.size();
  auto skip_blank_and_comments = [&](size_t j) {
    while (j < n) {
      if (std::isspace(static_cast<unsigned char>(text[j]))) {
        ++j;
      } else if (text[j] == '/' && j + 1 < n && text[j + 1] == '/') {
        while (j < n && text[j] != '\n') ++j;
      } else if (text[j] == '/' && j + 1 < n && text[j + 1] == '*') {
        size_t end = text.find("*/", j + 2);
        j = end == std::string_view::npos ? n : end + 2;
      } else {
        break;
      }
    }
    return j;
  };
  size_t i = 0;
  while (i < n) {
    char c = text[i];
    if (c == '"') {
      size_t j = i + 1;
      while (j < n && text[j] != '"') j += (text[j] == '\\') ? 2 : 1;
      j = std::min(j + 1, n);
      out.append(text.substr(i, j - i));
      i = j;
    } else if (c == '/' && i + 1 < n && (text[i + 1] == '/' || text[i + 1] == '*')) {
      size_t j = text[i + 1] == '/' ? text.find('\n', i) : text.find("*/", i + 2);
      j = j == std::string_view::npos ? n : (text[i + 1] == '/' ? j : j + 2);
      out.append(text.substr(i, j - i));
      i = j;
    } else if (c == ',') {
      size_t j = skip_blank_and_comments(i + 1);
      if (j < n && (text[j] == '}' || text[j] == ']')) {
        out.push_back(' ');  // keep byte offsets so syntax-error columns stay right
      } else {
        out.push_back(',');
      }
      ++i;
    } else {
      out.push_back(c);
      ++i;
    }
  }
  return out;
}

namespace {

bool looks_like_json_text(const std::string& s) {
  for (char c : s) {
    if (std::isspace(static_cast<unsigned char>(c))) continue;
    return c == '{';
  }
  return false;
}

// Line and column (1-based) of a byte offset, for syntax errors.
std::pair<size_t, size_t> line_col(std::string_view text, size_t offset) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return {line, col};
}

// The file's text, or an error that says what the path is when it is not a readable regular file.
// Only the path's status is examined before opening, so a FIFO or a device is refused without
// ever being opened (a FIFO would block, /dev/zero would never end).
std::string read_config_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    if (ec && ec != std::errc::no_such_file_or_directory)
      DS_THROW("[config] cannot read DeepSpeed config '{}': {}", path, ec.message());
    DS_THROW(
        "[config] cannot read DeepSpeed config '{}': no such file (a config given inline must be "
        "a JSON object starting with '{{')",
        path);
  }
  const char* kind = nullptr;
  switch (st.type()) {
    case fs::file_type::regular:
      break;
    case fs::file_type::directory:
      kind = "a directory";
      break;
    case fs::file_type::fifo:
      kind = "a FIFO (named pipe)";
      break;
    case fs::file_type::character:
      kind = "a character device";
      break;
    case fs::file_type::block:
      kind = "a block device";
      break;
    case fs::file_type::socket:
      kind = "a socket";
      break;
    default:
      kind = "not a regular file";
      break;
  }
  if (kind)
    DS_THROW(
        "[config] cannot read DeepSpeed config '{}': it is {}, not a regular file; give the path "
        "of a JSON file",
        path, kind);
  std::ifstream in(path, std::ios::binary);
  if (!in.good())
    DS_THROW("[config] cannot read DeepSpeed config '{}': {} (check its permissions)", path,
             std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  DS_CHECK(!in.bad(), "[config] reading DeepSpeed config '{}' failed: {}", path,
           std::strerror(errno));
  return ss.str();
}

// Deepest nesting of objects and arrays, outside strings and comments. nlohmann's parser recurses
// when it builds values, so a pathologically deep document would overflow the stack.
size_t nesting_depth(std::string_view text) {
  size_t depth = 0, deepest = 0;
  const size_t n = text.size();
  for (size_t i = 0; i < n; ++i) {
    const char c = text[i];
    if (c == '"') {
      ++i;
      while (i < n && text[i] != '"') i += text[i] == '\\' ? 2 : 1;
    } else if (c == '/' && i + 1 < n && text[i + 1] == '/') {
      while (i < n && text[i] != '\n') ++i;
    } else if (c == '/' && i + 1 < n && text[i + 1] == '*') {
      const size_t end = text.find("*/", i + 2);
      i = end == std::string_view::npos ? n : end + 1;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

json load_config_json(const std::string& path_or_json, std::string* source) {
  std::string text;
  std::string name;
  if (looks_like_json_text(path_or_json)) {
    text = path_or_json;
    name = "<json string>";
  } else {
    name = path_or_json;
    text = read_config_file(path_or_json);
  }
  if (source) *source = name;
  // DeepSpeed configs nest four or five levels; anything near this is a broken or hostile file.
  constexpr size_t kMaxDepth = 64;
  const size_t depth = nesting_depth(text);
  DS_CHECK(depth <= kMaxDepth,
           "[config] {}: objects and arrays nest {} levels deep; a DeepSpeed config needs a few "
           "(at most {} are accepted): check that the file is the config you meant",
           name, depth, kMaxDepth);
  std::string cleaned = strip_trailing_commas(text);
  // DeepSpeed refuses a key given twice in one object; nlohmann would silently keep the last.
  // The callback tracks, per open object, its keys so far and the key being read (for the path).
  struct Level {
    std::vector<std::string> keys;
    std::string current;
  };
  std::vector<Level> objects;
  auto reject_duplicates = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      objects.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      if (!objects.empty()) objects.pop_back();
    } else if (event == json::parse_event_t::key && !objects.empty()) {
      auto key = parsed.get<std::string>();
      auto& level = objects.back();
      if (std::find(level.keys.begin(), level.keys.end(), key) != level.keys.end()) {
        std::string path;
        for (size_t i = 0; i + 1 < objects.size(); ++i) path += objects[i].current + ".";
        DS_THROW("[config] {}: key '{}' appears twice in the same object; keep one", name,
                 path + key);
      }
      level.keys.push_back(key);
      level.current = key;
    }
    return true;
  };
  json root;
  try {
    root = json::parse(cleaned, reject_duplicates, /*allow_exceptions=*/true,
                       /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    auto [line, col] = line_col(cleaned, e.byte > 0 ? e.byte - 1 : 0);
    std::string what = e.what();
    // nlohmann's message starts with "[json.exception.parse_error.101] parse error at ...": keep
    // the part that explains the problem.
    auto pos = what.find("syntax error");
    if (pos != std::string::npos) what = what.substr(pos);
    DS_THROW("[config] {}: invalid JSON at line {}, column {}: {}", name, line, col, what);
  }
  DS_CHECK(root.is_object(), "[config] {}: a DeepSpeed config must be a JSON object, got {}", name,
           detail::json_kind(root));
  return root;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  return ds::edit_distance(a, b);
}

namespace detail {

std::optional<std::string> nearest_key(std::string_view key,
                                       const std::vector<std::string>& candidates) {
  return nearest_name(key, candidates);
}

bool Range::contains(double v) const {
  if (std::isnan(v)) return false;
  if (lo_open ? !(v > lo) : !(v >= lo)) return false;
  if (hi_open ? !(v < hi) : !(v <= hi)) return false;
  return true;
}

std::string Range::describe(bool integer) const {
  const char* what = integer ? "an integer" : "a number";
  auto num = [](double x) { return fmt::format("{}", x); };
  const bool has_lo = std::isfinite(lo), has_hi = std::isfinite(hi);
  if (has_lo && has_hi)
    return fmt::format("{} in {}{}, {}{}", what, lo_open ? "(" : "[", num(lo), num(hi),
                       hi_open ? ")" : "]");
  if (has_lo) return fmt::format("{} {} {}", what, lo_open ? ">" : ">=", num(lo));
  if (has_hi) return fmt::format("{} {} {}", what, hi_open ? "<" : "<=", num(hi));
  return what;
}

}  // namespace detail
}  // namespace ds::config
