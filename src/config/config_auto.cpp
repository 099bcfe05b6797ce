// Two rewrites of the raw JSON that run before typed reading: old spellings are mapped to the
// current keys (§1), then "auto" values are filled from the trainer's arguments and the model (§3)
// and explicit values are checked against the arguments (the Hugging Face Trainer convention).
#include <cmath>

#include "config_internal.h"
#include "ds/core/error.h"

namespace ds::config::detail {

namespace {

std::string join_path(const std::string& parent, std::string_view key) {
  return parent.empty() ? std::string(key) : parent + "." + std::string(key);
}

// Moves obj[old_key] to obj[new_key]; both present is an error (which one would win is a guess).
void rename_key(json& obj, const std::string& obj_path, const char* old_key, const char* new_key,
                bool deprecated, ParseState& st) {
  if (!obj.contains(old_key)) return;
  const std::string new_path = join_path(obj_path, new_key);
  const std::string old_path = join_path(obj_path, old_key);
  DS_CHECK(!obj.contains(new_key),
           "[config] {} is given twice in {}: as '{}' and as '{}'; keep one", new_path, st.source,
           new_key, old_key);
  obj[new_key] = std::move(obj[old_key]);
  obj.erase(old_key);
  st.notes[new_path] = fmt::format("written as {}", old_key);
  if (deprecated)
    st.warn(fmt::format("[config] {} is an old spelling, read as {}; please rename it", old_path,
                        new_path));
}

bool deprecated_flag(json& zero, const char* key, ParseState& st) {
  const json& v = zero[key];
  DS_CHECK(v.is_boolean(),
           "[config] zero_optimization.{}: expected true or false, got {} ({}) in {}", key,
           json_show(v), json_kind(v), st.source);
  return v.get<bool>();
}

bool is_auto(const json& v) {
  return v.is_string() && v.get<std::string>() == "auto";
}

bool values_equal(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) {
    double x = a.get<double>(), y = b.get<double>();
    return x == y || std::fabs(x - y) <= 1e-12 * std::max(std::fabs(x), std::fabs(y));
  }
  if (a.is_array() && b.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!values_equal(a[i], b[i])) return false;
    return true;
  }
  return a == b;
}

// The object holding the last component of a dotted path, or nullptr if any part is missing.
json* parent_of(json& root, const std::string& path, std::string* key) {
  json* node = &root;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (dot == std::string::npos) {
      *key = part;
      return node->is_object() && node->contains(part) ? node : nullptr;
    }
    if (!node->is_object() || !node->contains(part)) return nullptr;
    node = &(*node)[part];
    start = dot + 1;
  }
}

class AutoFiller {
 public:
  AutoFiller(json& root, ParseState& st) : root_(root), st_(st) {}

  // HF's fill_match: "auto" takes the argument; an explicit value must equal it (when given).
  void fill(const std::string& path, std::optional<json> value, const std::string& arg,
            bool must_match = true) {
    std::string key;
    json* parent = parent_of(root_, path, &key);
    if (!parent) return;
    json& v = (*parent)[key];
    if (is_auto(v)) {
      if (value) {
        v = *value;
        st_.auto_filled.insert(path);
        st_.notes[path] = fmt::format("auto: trainer {}", arg);
      } else {
        st_.auto_hints[path] = fmt::format(
            "the trainer did not give {}; pass it to the trainer or write a value", arg);
      }
      return;
    }
    if (value && must_match && !v.is_null() && v.type() != json::value_t::string &&
        !values_equal(v, *value))
      mismatches_.push_back(
          fmt::format("  - ds {}={} vs trainer {}={}", path, v.dump(), arg, value->dump()));
  }

  void add_mismatch(std::string line) { mismatches_.push_back(std::move(line)); }
  const std::vector<std::string>& mismatches() const { return mismatches_; }

 private:
  json& root_;
  ParseState& st_;
  std::vector<std::string> mismatches_;
};

template <class T>
std::optional<json> opt_json(const std::optional<T>& v) {
  if (!v) return std::nullopt;
  return json(*v);
}

}  // namespace

void normalize_deprecated(json& root, ParseState& st) {
  rename_key(root, "", "bfloat16", "bf16", /*deprecated=*/true, st);

  if (root.contains("zero_optimization") && root["zero_optimization"].is_boolean()) {
    // The pre-0.3 form "zero_optimization": true meant stage 1, with "allgather_size" beside it.
    const bool on = root["zero_optimization"].get<bool>();
    json zero = json::object();
    zero["stage"] = on ? 1 : 0;
    if (on && root.contains("allgather_size")) {
      zero["allgather_bucket_size"] = root["allgather_size"];
      root.erase("allgather_size");
      st.notes["zero_optimization.allgather_bucket_size"] = "written as top-level allgather_size";
    }
    root["zero_optimization"] = zero;
    st.notes["zero_optimization.stage"] = fmt::format("written as \"zero_optimization\": {}", on);
    st.warn(
        fmt::format("[config] \"zero_optimization\": {} is an old form; read as "
                    "{{\"stage\": {}}}",
                    on, on ? 1 : 0));
  }

  if (root.contains("zero_optimization") && root["zero_optimization"].is_object()) {
    json& zero = root["zero_optimization"];
    const std::string zp = "zero_optimization";
    struct OldOffload {
      const char* old_key;
      const char* new_key;
    };
    for (auto [old_key, new_key] : {OldOffload{"cpu_offload", "offload_optimizer"},
                                    OldOffload{"cpu_offload_param", "offload_param"}}) {
      if (!zero.contains(old_key)) continue;
      const bool on = deprecated_flag(zero, old_key, st);
      zero.erase(old_key);
      st.warn(fmt::format("[config] {}.{} is deprecated; read as {}.{}.device = \"{}\"", zp,
                          old_key, zp, new_key, on ? "cpu" : "none"));
      if (!on) continue;
      DS_CHECK(!zero.contains(new_key),
               "[config] {}.{} and {}.{} are both given in {}; keep only {}", zp, old_key, zp,
               new_key, st.source, new_key);
      zero[new_key] = json{{"device", "cpu"}};
      st.notes[zp + "." + new_key + ".device"] = fmt::format("written as {}: true", old_key);
    }
    if (zero.contains("cpu_offload_use_pin_memory")) {
      const bool on = deprecated_flag(zero, "cpu_offload_use_pin_memory", st);
      zero.erase("cpu_offload_use_pin_memory");
      st.warn(
          fmt::format("[config] {}.cpu_offload_use_pin_memory is deprecated; read as "
                      "pin_memory of offload_optimizer and offload_param",
                      zp));
      for (const char* section : {"offload_optimizer", "offload_param"}) {
        if (!on || !zero.contains(section) || !zero[section].is_object()) continue;
        if (zero[section].contains("pin_memory")) continue;
        zero[section]["pin_memory"] = true;
        st.notes[zp + "." + section + ".pin_memory"] = "written as cpu_offload_use_pin_memory";
      }
    }
    // A public guide's NVMe example nests aio here; DeepSpeed rejects it with a bare "extra
    // fields not permitted". Say where it belongs.
    DS_CHECK(!zero.contains("aio"),
             "[config] zero_optimization.aio in {}: aio is a top-level section (a sibling of "
             "zero_optimization, not inside it); move \"aio\": {{...}} to the top level",
             st.source);
    rename_key(zero, zp, "stage3_gather_fp16_weights_on_model_save",
               "stage3_gather_16bit_weights_on_model_save", /*deprecated=*/true, st);
    // DeepSpeed's field names are the unprefixed ones; the stage3_ spelling is the documented
    // alias. Both are current, so no warning: we keep the documented spelling.
    for (const char* k :
         {"prefetch_bucket_size", "param_persistence_threshold", "model_persistence_threshold",
          "max_live_parameters", "max_reuse_distance", "gather_16bit_weights_on_model_save",
          "module_granularity_threshold", "use_all_reduce_for_fetch_params"}) {
      rename_key(zero, zp, k, (std::string("stage3_") + k).c_str(), /*deprecated=*/false, st);
    }
  }

  if (root.contains("aio") && root["aio"].is_object())
    rename_key(root["aio"], "aio", "thread_count", "intra_op_parallelism", /*deprecated=*/true, st);
}

namespace {

// The batch triad. An "auto" without a trainer value is treated as absent, so that the batch
// rules derive it.
void fill_batch(AutoFiller& f, json& root, const ConfigContext& ctx, ParseState& st) {
  const TrainerArgs& a = ctx.args;
  f.fill("train_micro_batch_size_per_gpu", opt_json(a.per_device_train_batch_size),
         "per_device_train_batch_size");
  f.fill("gradient_accumulation_steps", opt_json(a.gradient_accumulation_steps),
         "gradient_accumulation_steps");
  std::optional<json> train;
  if (a.per_device_train_batch_size && a.gradient_accumulation_steps)
    train = json(int64_t{ctx.world_size} * *a.per_device_train_batch_size *
                 *a.gradient_accumulation_steps);
  f.fill("train_batch_size", train,
         fmt::format("train_batch_size (calculated: world size {} x per_device_train_batch_size x "
                     "gradient_accumulation_steps)",
                     ctx.world_size));
  for (const char* k :
       {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"}) {
    if (root.contains(k) && is_auto(root[k])) {
      root.erase(k);
      st.auto_dropped.insert(k);
      st.auto_hints.erase(k);
    }
  }
}

// optimizer.params.betas pairs two arguments: "auto" needs both, an explicit pair is checked
// element-wise.
void fill_betas(AutoFiller& f, json& root, const TrainerArgs& a, ParseState& st) {
  std::string key;
  json* params = parent_of(root, "optimizer.params.betas", &key);
  if (!params) return;
  json& v = (*params)[key];
  if (is_auto(v)) {
    if (a.adam_beta1 && a.adam_beta2) {
      v = json::array({*a.adam_beta1, *a.adam_beta2});
      st.auto_filled.insert("optimizer.params.betas");
      st.notes["optimizer.params.betas"] = "auto: trainer [adam_beta1, adam_beta2]";
    } else {
      st.auto_hints["optimizer.params.betas"] =
          "the trainer did not give both adam_beta1 and adam_beta2; pass them or write "
          "[beta1, beta2]";
    }
  } else if (v.is_array() && v.size() == 2) {
    if (a.adam_beta1 && v[0].is_number() && !values_equal(v[0], json(*a.adam_beta1)))
      f.add_mismatch(fmt::format("  - ds optimizer.params.betas[0]={} vs trainer adam_beta1={}",
                                 v[0].dump(), json(*a.adam_beta1).dump()));
    if (a.adam_beta2 && v[1].is_number() && !values_equal(v[1], json(*a.adam_beta2)))
      f.add_mismatch(fmt::format("  - ds optimizer.params.betas[1]={} vs trainer adam_beta2={}",
                                 v[1].dump(), json(*a.adam_beta2).dump()));
  }
}

// The value of a hidden-size based key ("auto": DeepSpeed's H*H, 0.9*H*H, 10*H) and how it was
// found.
std::pair<int64_t, std::string> hidden_size_value(std::string_view k, int64_t h) {
  if (k == "reduce_bucket_size") return {h * h, fmt::format("auto: model hidden_size {}: H*H", h)};
  if (k == "stage3_prefetch_bucket_size")
    return {static_cast<int64_t>(0.9 * static_cast<double>(h) * static_cast<double>(h)),
            fmt::format("auto: model hidden_size {}: 0.9*H*H", h)};
  return {10 * h, fmt::format("auto: model hidden_size {}: 10*H", h)};
}

// The zero_optimization keys filled from the model's hidden size; the stage-3 ones are dropped
// below stage 3 (DeepSpeed drops the "auto" too: the default stays).
void fill_hidden_size_keys(json& root, const ConfigContext& ctx, ParseState& st) {
  int64_t stage = 0;
  if (root.contains("zero_optimization") && root["zero_optimization"].is_object()) {
    const json& s = root["zero_optimization"].value("stage", json(0));
    if (s.is_number_integer()) stage = s.get<int64_t>();
  }
  std::vector<std::string> missing;
  for (auto [k, stage3_only] : {std::pair{"reduce_bucket_size", false},
                                std::pair{"stage3_prefetch_bucket_size", true},
                                std::pair{"stage3_param_persistence_threshold", true}}) {
    const std::string path = std::string("zero_optimization.") + k;
    std::string key;
    json* zero = parent_of(root, path, &key);
    if (!zero || !is_auto((*zero)[key])) continue;
    if (stage3_only && stage != 3) {
      zero->erase(key);
      st.notes[path] = fmt::format("was \"auto\"; unused at stage {}", stage);
      continue;
    }
    if (!ctx.hidden_size) {
      missing.push_back(path);
      continue;
    }
    const auto [v, how] = hidden_size_value(k, *ctx.hidden_size);
    (*zero)[key] = v;
    st.auto_filled.insert(path);
    st.notes[path] = how;
  }
  if (!missing.empty())
    DS_THROW(
        "[config] the model's hidden size is unknown, so \"auto\" cannot be filled in {} for: "
        "{}. Write integers for these keys (DeepSpeed's defaults: reduce_bucket_size 5e8, "
        "stage3_prefetch_bucket_size 5e7, stage3_param_persistence_threshold 1e5)",
        st.source, fmt::join(missing, ", "));
}

}  // namespace

void resolve_auto(json& root, const ConfigContext& ctx, ParseState& st) {
  const TrainerArgs& a = ctx.args;
  AutoFiller f(root, st);
  fill_batch(f, root, ctx, st);
  f.fill("gradient_clipping", opt_json(a.max_grad_norm), "max_grad_norm");
  f.fill("optimizer.params.lr", opt_json(a.learning_rate), "learning_rate");
  fill_betas(f, root, a, st);
  f.fill("optimizer.params.eps", opt_json(a.adam_epsilon), "adam_epsilon");
  f.fill("optimizer.params.weight_decay", opt_json(a.weight_decay), "weight_decay");
  f.fill("scheduler.params.warmup_min_lr", json(0.0), "(none: 0 by convention)",
         /*must_match=*/false);
  f.fill("scheduler.params.warmup_max_lr", opt_json(a.learning_rate), "learning_rate");
  f.fill("scheduler.params.warmup_num_steps", opt_json(a.warmup_steps), "warmup_steps");
  f.fill("scheduler.params.total_num_steps", opt_json(a.total_steps), "total_steps");
  f.fill("fp16.enabled", opt_json(a.fp16), "fp16");
  f.fill("bf16.enabled", opt_json(a.bf16), "bf16");
  fill_hidden_size_keys(root, ctx, st);
  if (!f.mismatches().empty())
    DS_THROW(
        "[config] {} contradicts the trainer's arguments:\n{}\nSet these config values to "
        "\"auto\" to take them from the trainer, or make them equal",
        st.source, fmt::join(f.mismatches(), "\n"));
}

}  // namespace ds::config::detail
