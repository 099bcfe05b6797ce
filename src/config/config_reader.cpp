// The Section reader: per-key validation with messages that name the JSON path, the value and what
// is allowed, and the bookkeeping behind the effective-config report.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include "config_internal.h"
#include "ds/core/error.h"

namespace ds::config::detail {

void ParseState::record(const std::string& path, json value, Origin origin, std::string note) {
  if (note.empty()) note = note_for(path);
  auto it = index.find(path);
  if (it != index.end()) {
    effective[it->second] = ConfigValue{path, std::move(value), origin, std::move(note)};
    return;
  }
  index.emplace(path, effective.size());
  effective.push_back(ConfigValue{path, std::move(value), origin, std::move(note)});
}

void ParseState::update(const std::string& path, json value, Origin origin, std::string note) {
  record(path, std::move(value), origin, std::move(note));
}

std::string ParseState::note_for(const std::string& path) const {
  // The longest recorded prefix wins: a note on "bf16" covers "bf16.enabled".
  std::string p = path;
  while (true) {
    auto it = notes.find(p);
    if (it != notes.end()) return it->second;
    auto dot = p.rfind('.');
    if (dot == std::string::npos) return {};
    p.resize(dot);
  }
}

void ParseState::warn(std::string message) {
  if (std::find(warnings.begin(), warnings.end(), message) == warnings.end())
    warnings.push_back(std::move(message));
}

namespace {
// Top-level sections that DeepSpeed 0.19 validates with pydantic models (DeepSpeedConfigModel):
// runtime/zero/config.py and offload_config.py, runtime/precision_config.py, monitor/config.py,
// profiling/config.py, comm/config.py, runtime/compiler.py. Everything else it reads with
// get_scalar_param (the raw JSON value) or hands to PyTorch.
const std::set<std::string, std::less<>> kPydanticSections = {
    "zero_optimization", "fp16", "bf16", "tensorboard", "wandb", "csv_monitor", "comet",
    "flops_profiler", "comms_logger", "compile",
};
}  // namespace

Section::Section(ParseState& st, const json* obj, std::string path)
    : st_(st), obj_(obj), path_(std::move(path)) {
  lax_ = kPydanticSections.count(std::string_view(path_).substr(0, path_.find('.'))) > 0;
}

std::optional<bool> Section::lax_boolean(std::string_view key, const json& v) {
  if (!lax_) return std::nullopt;
  std::optional<bool> out;
  if (v.is_number_integer() || v.is_number_unsigned()) {
    // pydantic's lax bool takes the integers 0 and 1.
    if (v == 0) out = false;
    if (v == 1) out = true;
  } else if (v.is_string()) {
    std::string t = v.get<std::string>();
    for (auto& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    for (const char* s : {"1", "true", "t", "yes", "y", "on"})
      if (t == s) out = true;
    for (const char* s : {"0", "false", "f", "no", "n", "off"})
      if (t == s) out = false;
  }
  if (out)
    st_.notes[key_path(key)] = fmt::format("given as {}; DeepSpeed (pydantic) takes it as {}",
                                           json_show(v), *out);
  return out;
}

std::optional<json> Section::lax_number(std::string_view key, const json& v) {
  if (!lax_ || !v.is_string()) return std::nullopt;
  const std::string s = v.get<std::string>();
  // A JSON number, with the surrounding spaces pydantic strips; "auto", "", "1e" stay strings.
  const auto b = s.find_first_not_of(" \t\n\r");
  const auto e = s.find_last_not_of(" \t\n\r");
  if (b == std::string::npos) return std::nullopt;
  json n = json::parse(s.substr(b, e - b + 1), nullptr, /*allow_exceptions=*/false);
  if (n.is_discarded() || !n.is_number()) return std::nullopt;
  st_.notes[key_path(key)] =
      fmt::format("given as {}; DeepSpeed (pydantic) takes it as a number", json_show(v));
  return n;
}

std::string Section::key_path(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

bool Section::has(std::string_view key) const {
  return obj_ && obj_->contains(key);
}

const json* Section::raw_value(std::string_view key) const {
  if (!obj_) return nullptr;
  auto it = obj_->find(key);
  return it == obj_->end() ? nullptr : &*it;
}

const json* Section::lookup(std::string_view key) {
  declare(key);
  return raw_value(key);
}

namespace {
// Keys whose DeepSpeed schema is Optional (pydantic `Optional[...] = None`, or a scalar read with a
// None default), where null means "not set". Everywhere else DeepSpeed either rejects null or
// crashes on it later (`"gradient_clipping": null` fails at the first step), so null is refused.
const std::set<std::string, std::less<>> kNullable = {
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "steps_per_print",
    "activation_checkpointing.number_checkpoints",
    "communication_data_type",
    "seq_parallel_communication_data_type",
    "data_types.grad_accum_dtype",
    "zero_optimization.overlap_comm",
    "zero_optimization.offload_param",
    "zero_optimization.offload_optimizer",
    "zero_optimization.offload_param.nvme_path",
    "zero_optimization.offload_optimizer.nvme_path",
    "zero_optimization.cpu_offload",
    "zero_optimization.cpu_offload_param",
    "zero_optimization.cpu_offload_use_pin_memory",
    "scheduler.params.cycle_second_step_size",
    "scheduler.params.cycle_second_stair_count",
    "scheduler.params.warmup_max_lr",
    "wandb.group",
    "wandb.team",
    "comet.project",
    "comet.workspace",
    "comet.api_key",
    "comet.experiment_name",
    "comet.experiment_key",
    "comet.online",
    "comet.mode",
};
}  // namespace

bool Section::absent(std::string_view key, const json* v) const {
  if (!v) return true;
  if (!v->is_null()) return false;
  const std::string p = key_path(key);
  if (kNullable.count(p)) return true;
  DS_THROW(
      "[config] {} is null in {}: DeepSpeed does not accept null for this key; write a value, or "
      "remove the key to get its default",
      p, st_.source);
}

void Section::declare(std::string_view key) {
  if (std::find(known_.begin(), known_.end(), key) == known_.end()) known_.emplace_back(key);
}

void Section::add_aliases(std::initializer_list<std::string_view> names) {
  for (auto n : names) aliases_.emplace_back(n);
}

void Section::type_error(std::string_view key, const json& v, std::string_view expected) const {
  DS_THROW("[config] {}: expected {}, got {} ({}) in {}", key_path(key), expected, json_show(v),
           json_kind(v), st_.source);
}

void Section::range_error(std::string_view key, const json& v, std::string_view allowed) const {
  DS_THROW("[config] {} = {} is not allowed in {}: allowed is {}", key_path(key), json_show(v),
           st_.source, allowed);
}

void Section::reject_auto(std::string_view key, const json& v) const {
  if (!(v.is_string() && v.get<std::string>() == "auto")) return;
  const std::string p = key_path(key);
  auto hint = st_.auto_hints.find(p);
  if (hint != st_.auto_hints.end())
    DS_THROW("[config] {} is \"auto\" in {} but nothing resolved it: {}", p, st_.source,
             hint->second);
  DS_THROW(
      "[config] {} is \"auto\" in {}, but deepspeed.cpp has no source for this key: write "
      "a value",
      p, st_.source);
}

void Section::record(std::string_view key, const json* given, json effective, json def) {
  const std::string p = key_path(key);
  defaults_[std::string(key)] = std::move(def);
  Origin origin = Origin::Default;
  if (given) origin = st_.auto_filled.count(p) ? Origin::Auto : Origin::File;
  st_.record(p, std::move(effective), origin);
}

std::optional<int64_t> Section::as_integer(std::string_view key, const json& v,
                                           const Range& r) const {
  reject_auto(key, v);
  int64_t out = 0;
  if (v.is_number_unsigned()) {
    auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) range_error(key, v, r.describe(true));
    out = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    out = v.get<int64_t>();
  } else if (v.is_number_float()) {
    // DeepSpeed configs commonly write sizes as 5e8: accept floats with an integral value.
    double d = v.get<double>();
    if (!std::isfinite(d) || std::floor(d) != d || std::fabs(d) > 9.2e18)
      type_error(key, v, r.describe(true));
    out = static_cast<int64_t>(d);
  } else {
    type_error(key, v, r.describe(true));
  }
  if (!r.contains(static_cast<double>(out))) range_error(key, v, r.describe(true));
  return out;
}

double Section::as_number(std::string_view key, const json& v, const Range& r) const {
  reject_auto(key, v);
  if (!v.is_number()) type_error(key, v, r.describe(false));
  double d = v.get<double>();
  if (!r.contains(d)) range_error(key, v, r.describe(false));
  return d;
}

bool Section::boolean(std::string_view key, bool def) {
  auto v = opt_boolean(key);
  defaults_[std::string(key)] = def;
  if (!v) st_.record(key_path(key), def, Origin::Default);
  return v.value_or(def);
}

std::optional<bool> Section::opt_boolean(std::string_view key) {
  const json* v = lookup(key);
  if (absent(key, v)) {
    defaults_[std::string(key)] = nullptr;
    st_.record(key_path(key), nullptr, v ? Origin::File : Origin::Default);
    return std::nullopt;
  }
  reject_auto(key, *v);
  if (auto b = lax_boolean(key, *v)) {
    record(key, v, *b, nullptr);
    return *b;
  }
  if (v->is_string()) {
    // Outside pydantic's sections DeepSpeed keeps the string, and any non-empty one is true.
    std::string t = v->get<std::string>();
    for (auto& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (t == "true" || t == "false")
      DS_THROW(
          "[config] {} = {} (a string) in {}: write {} without quotes (a JSON boolean); "
          "DeepSpeed reads this key without converting it, so a quoted \"false\" would count "
          "as true there",
          key_path(key), json_show(*v), st_.source, t);
  }
  if (!v->is_boolean()) type_error(key, *v, "true or false");
  record(key, v, *v, nullptr);
  return v->get<bool>();
}

int64_t Section::integer(std::string_view key, int64_t def, Range r) {
  auto v = opt_integer(key, r);
  defaults_[std::string(key)] = def;
  if (!v) st_.record(key_path(key), def, Origin::Default);
  return v.value_or(def);
}

std::optional<int64_t> Section::opt_integer(std::string_view key, Range r) {
  const json* v = lookup(key);
  if (absent(key, v)) {
    defaults_[std::string(key)] = nullptr;
    st_.record(key_path(key), nullptr, v ? Origin::File : Origin::Default);
    return std::nullopt;
  }
  const auto lax = lax_number(key, *v);
  auto out = as_integer(key, lax ? *lax : *v, r);
  record(key, v, *out, nullptr);
  return out;
}

double Section::number(std::string_view key, double def, Range r) {
  auto v = opt_number(key, r);
  defaults_[std::string(key)] = def;
  if (!v) st_.record(key_path(key), def, Origin::Default);
  return v.value_or(def);
}

std::optional<double> Section::opt_number(std::string_view key, Range r) {
  const json* v = lookup(key);
  if (absent(key, v)) {
    defaults_[std::string(key)] = nullptr;
    st_.record(key_path(key), nullptr, v ? Origin::File : Origin::Default);
    return std::nullopt;
  }
  const auto lax = lax_number(key, *v);
  double d = as_number(key, lax ? *lax : *v, r);
  record(key, v, d, nullptr);
  return d;
}

std::string Section::string(std::string_view key, std::string def) {
  auto v = opt_string(key);
  defaults_[std::string(key)] = def;
  if (!v) st_.record(key_path(key), def, Origin::Default);
  return v.value_or(def);
}

std::optional<std::string> Section::opt_string(std::string_view key) {
  const json* v = lookup(key);
  if (absent(key, v)) {
    defaults_[std::string(key)] = nullptr;
    st_.record(key_path(key), nullptr, v ? Origin::File : Origin::Default);
    return std::nullopt;
  }
  reject_auto(key, *v);
  if (!v->is_string()) type_error(key, *v, "a string");
  record(key, v, *v, nullptr);
  return v->get<std::string>();
}

namespace {
bool iequal(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}
std::string quoted_list(const std::vector<std::string>& xs) {
  std::string out;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i) out += i + 1 == xs.size() ? " or " : ", ";
    out += "\"" + xs[i] + "\"";
  }
  return out;
}
}  // namespace

std::optional<std::string> Section::opt_choice(std::string_view key,
                                               const std::vector<std::string>& allowed, bool ci) {
  const json* v = lookup(key);
  if (absent(key, v)) {
    defaults_[std::string(key)] = nullptr;
    st_.record(key_path(key), nullptr, v ? Origin::File : Origin::Default);
    return std::nullopt;
  }
  reject_auto(key, *v);
  if (!v->is_string()) type_error(key, *v, "one of " + quoted_list(allowed));
  const auto s = v->get<std::string>();
  for (const auto& a : allowed) {
    if (ci ? iequal(a, s) : a == s) {
      record(key, v, a, nullptr);
      return a;
    }
  }
  std::string hint;
  if (auto near = nearest_key(s, allowed)) hint = fmt::format(" (did you mean \"{}\"?)", *near);
  DS_THROW("[config] {} = {} is not allowed in {}: allowed is one of {}{}", key_path(key),
           json_show(*v), st_.source, quoted_list(allowed), hint);
}

std::string Section::choice(std::string_view key, const std::string& def,
                            const std::vector<std::string>& allowed, bool ci) {
  auto v = opt_choice(key, allowed, ci);
  defaults_[std::string(key)] = def;
  if (!v) st_.record(key_path(key), def, Origin::Default);
  return v.value_or(def);
}

std::array<double, 2> Section::number_pair(std::string_view key, std::array<double, 2> def,
                                           Range r) {
  const json* v = lookup(key);
  defaults_[std::string(key)] = json::array({def[0], def[1]});
  if (absent(key, v)) {
    st_.record(key_path(key), json::array({def[0], def[1]}), Origin::Default);
    return def;
  }
  reject_auto(key, *v);
  const std::string expected = "a list of two numbers, each " + r.describe(false);
  if (!v->is_array() || v->size() != 2) type_error(key, *v, expected);
  std::array<double, 2> out{};
  for (size_t i = 0; i < 2; ++i) {
    const json& e = (*v)[i];
    reject_auto(key, e);
    if (!e.is_number()) type_error(key, *v, expected);
    out[i] = e.get<double>();
    if (!r.contains(out[i])) range_error(key, *v, expected);
  }
  record(key, v, json::array({out[0], out[1]}), json::array({def[0], def[1]}));
  return out;
}

std::vector<std::string> Section::string_list(std::string_view key) {
  const json* v = lookup(key);
  defaults_[std::string(key)] = json::array();
  if (absent(key, v)) {
    st_.record(key_path(key), json::array(), Origin::Default);
    return {};
  }
  reject_auto(key, *v);
  if (!v->is_array()) type_error(key, *v, "a list of strings");
  std::vector<std::string> out;
  for (const auto& e : *v) {
    if (!e.is_string()) type_error(key, *v, "a list of strings");
    out.push_back(e.get<std::string>());
  }
  record(key, v, *v, json::array());
  return out;
}

json Section::any(std::string_view key, json def) {
  const json* v = lookup(key);
  defaults_[std::string(key)] = def;
  if (!v) {
    st_.record(key_path(key), def, Origin::Default);
    return def;
  }
  reject_auto(key, *v);
  record(key, v, *v, def);
  return *v;
}

Section Section::child(std::string_view key) {
  const json* v = lookup(key);
  if (v && v->is_null() && absent(key, v)) v = nullptr;
  if (v) {
    reject_auto(key, *v);
    if (!v->is_object()) type_error(key, *v, "an object");
  }
  return Section(st_, v, key_path(key));
}

void Section::todo(std::string_view key, std::string_view what) {
  const json* v = raw_value(key);
  if (!v) return;
  auto d = defaults_.find(key);
  if (d != defaults_.end() && *v == d->second) return;
  // A float written for an integer default (5e8 vs 500000000) compares unequal as JSON.
  if (d != defaults_.end() && v->is_number() && d->second.is_number() &&
      v->get<double>() == d->second.get<double>())
    return;
  st_.warn(
      fmt::format("[config] {} = {}: {} is not implemented in deepspeed.cpp yet; the key is "
                  "accepted and ignored",
                  key_path(key), json_show(*v), what));
}

void Section::finish() {
  if (!obj_) return;
  for (const auto& item : obj_->items()) {
    if (std::find(known_.begin(), known_.end(), item.key()) != known_.end()) continue;
    st_.unknown.push_back(UnknownKey{path_, item.key(), known_, aliases_});
  }
}

}  // namespace ds::config::detail
