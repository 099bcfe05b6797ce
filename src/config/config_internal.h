#pragma once
// Private to the config parser (src/config/config_*.cpp): the parse state shared by the steps
// (deprecated spellings -> auto -> typed reading -> batch rules -> cross checks) and the Section
// reader that validates one JSON object against the keys the code asks for.
#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/config/config.h"
#include "ds/core/json_text.h"

namespace ds::config::detail {

using json = nlohmann::json;

// An allowed interval for a number; describes itself in messages ("an integer >= 1").
struct Range {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;
  bool hi_open = false;
  bool contains(double v) const;
  std::string describe(bool integer) const;
};
inline Range any_value() {
  return {};
}
inline Range at_least(double lo) {
  return Range{lo};
}
inline Range above(double lo) {
  return Range{lo, std::numeric_limits<double>::infinity(), true};
}
inline Range between(double lo, double hi) {
  return Range{lo, hi};
}

// "a string", "an integer", ... for type errors; dump() of the value for messages (shared with
// ds_serve's request parser).
using ds::json_kind;
using ds::json_show;

// Nearest candidate by edit distance when close enough to be a plausible typo.
std::optional<std::string> nearest_key(std::string_view key,
                                       const std::vector<std::string>& candidates);

struct UnknownKey {
  std::string section;  // "" for the top level
  std::string key;
  std::vector<std::string> candidates;  // valid keys of that section
  std::vector<std::string> aliases;     // accepted old spellings, offered only as suggestions
};

struct ParseState {
  std::string source;
  std::vector<ConfigValue> effective;
  std::unordered_map<std::string, size_t> index;  // path -> position in effective
  std::vector<std::string> warnings;
  std::set<std::string> auto_filled;   // paths whose "auto" was resolved
  std::set<std::string> auto_dropped;  // batch keys whose "auto" had no source: derived instead
  std::map<std::string, std::string> notes;       // path (or a prefix) -> note for the report
  std::map<std::string, std::string> auto_hints;  // path -> what would resolve its "auto"
  std::vector<UnknownKey> unknown;

  void record(const std::string& path, json value, Origin origin, std::string note = {});
  // Overwrites value/origin/note of an already recorded path (batch derivation, dtype defaults).
  void update(const std::string& path, json value, Origin origin, std::string note = {});
  std::string note_for(const std::string& path) const;
  void warn(std::string message);
};

// Reads one JSON object key by key. Every accessor declares a key as valid for this section,
// validates its type and range, and records the effective value; finish() reports every key of
// the object that no accessor asked for.
class Section {
 public:
  Section(ParseState& st, const json* obj, std::string path);

  bool present() const { return obj_ != nullptr; }
  bool has(std::string_view key) const;
  const std::string& path() const { return path_; }
  std::string key_path(std::string_view key) const;
  const json* raw_value(std::string_view key) const;  // no validation, no bookkeeping

  bool boolean(std::string_view key, bool def);
  std::optional<bool> opt_boolean(std::string_view key);
  int64_t integer(std::string_view key, int64_t def, Range r = {});
  std::optional<int64_t> opt_integer(std::string_view key, Range r = {});
  double number(std::string_view key, double def, Range r = {});
  std::optional<double> opt_number(std::string_view key, Range r = {});
  std::string string(std::string_view key, std::string def);
  std::optional<std::string> opt_string(std::string_view key);
  // One of `allowed` (case-insensitive when ci); returns the allowed spelling.
  std::optional<std::string> opt_choice(std::string_view key,
                                        const std::vector<std::string>& allowed, bool ci = false);
  std::string choice(std::string_view key, const std::string& def,
                     const std::vector<std::string>& allowed, bool ci = false);
  std::array<double, 2> number_pair(std::string_view key, std::array<double, 2> def, Range r = {});
  std::vector<std::string> string_list(std::string_view key);
  json any(std::string_view key, json def);  // any JSON, kept verbatim
  // A nested object; absent (or null where DeepSpeed allows it) gives an absent section. Anything
  // else is a type error.
  Section child(std::string_view key);
  // Declares `key` valid without reading it (read elsewhere).
  void declare(std::string_view key);
  // Extra names offered in "did you mean" (accepted aliases that normalisation already mapped).
  void add_aliases(std::initializer_list<std::string_view> names);

  // Warns once that `key` is accepted but not implemented, when the file sets it to a value other
  // than its default. `what` says what the key does.
  void todo(std::string_view key, std::string_view what);

  // Records the keys nobody asked for; reported together after all sections are read.
  void finish();

  [[noreturn]] void type_error(std::string_view key, const json& v,
                               std::string_view expected) const;
  [[noreturn]] void range_error(std::string_view key, const json& v,
                                std::string_view allowed) const;

 private:
  const json* lookup(std::string_view key);  // declares the key; nullptr when absent
  // True when `key` is absent, or null where DeepSpeed's schema takes null as "not set" (its
  // Optional fields); a null anywhere else is an error naming the key.
  bool absent(std::string_view key, const json* v) const;
  void reject_auto(std::string_view key, const json& v) const;
  void record(std::string_view key, const json* given, json effective, json def);
  std::optional<int64_t> as_integer(std::string_view key, const json& v, const Range& r) const;
  // DeepSpeed reads the sections it models with pydantic (zero_optimization, fp16, bf16, the
  // monitors, ...) in lax mode: "true"/"off"/1 become booleans and "5e8" becomes a number. In those
  // sections (lax_) such a value is taken as pydantic takes it and the report says so; elsewhere
  // DeepSpeed passes the raw value on (a quoted "false" counts as true), so it is refused.
  std::optional<bool> lax_boolean(std::string_view key, const json& v);
  std::optional<json> lax_number(std::string_view key, const json& v);
  double as_number(std::string_view key, const json& v, const Range& r) const;

  ParseState& st_;
  const json* obj_;
  std::string path_;
  bool lax_ = false;
  std::vector<std::string> known_;
  std::vector<std::string> aliases_;
  std::map<std::string, json, std::less<>> defaults_;
};

// Steps implemented in config_auto.cpp.
void normalize_deprecated(json& root, ParseState& st);
void resolve_auto(json& root, const ConfigContext& ctx, ParseState& st);

}  // namespace ds::config::detail
