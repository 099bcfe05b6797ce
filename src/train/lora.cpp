#include "ds/train/lora.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ds/core/error.h"
#include "ds/models/family.h"
#include "ds/models/hf_io.h"
#include "ds/models/peft_io.h"
#include "ds/nn/layers.h"
#include "ds/nn/moe.h"

namespace ds::train {

namespace fs = std::filesystem;

std::optional<nn::LoraConfig> lora_config(const Options& o, const Given& g,
                                          const std::vector<std::string>& default_targets) {
  if (o.lora_dim == 0) {
    const char* stray = o.only_optimize_lora ? "--only_optimize_lora"
                        : o.merge_lora       ? "--merge_lora"
                        : g.lora_alpha       ? "--lora_alpha"
                        : g.lora_module_name ? "--lora_module_name"
                        : g.lora_dropout     ? "--lora_dropout"
                                             : nullptr;
    DS_CHECK(!stray, "[ds_train] {} needs LoRA: give --lora_dim R (R > 0, e.g. 8)", stray);
    return std::nullopt;
  }
  nn::LoraConfig c;
  c.r = o.lora_dim;
  c.alpha = static_cast<float>(o.lora_alpha);
  c.dropout = static_cast<float>(o.lora_dropout);
  c.only_optimize_lora = o.only_optimize_lora;
  c.seed = o.seed;
  if (g.lora_module_name) {
    std::string rest = o.lora_module_name;
    while (true) {
      const size_t comma = rest.find(',');
      const std::string item = rest.substr(0, comma);
      DS_CHECK(
          !item.empty(),
          "[ds_train] --lora_module_name '{}' has an empty name (a stray comma?); give a comma "
          "list such as q_proj,v_proj",
          o.lora_module_name);
      c.targets.push_back(item);
      if (comma == std::string::npos) break;
      rest = rest.substr(comma + 1);
    }
  } else {
    c.targets = default_targets;
  }
  try {
    c.validate();
  } catch (const Error& e) {
    DS_THROW("[ds_train] {} (flags --lora_dim, --lora_alpha, --lora_dropout, --lora_module_name)",
             e.what());
  }
  return c;
}

std::optional<nn::LoraConfig> lora_config(const Options& o, const Given& g,
                                          const models::GPTConfig& model) {
  return lora_config(o, g, models::family_of(model).lora_targets);
}

std::optional<nn::LoraConfig> encoder_lora_config(const Options& o, const Given& g,
                                                  const models::EncoderConfig& model) {
  auto c = lora_config(o, g, models::family_of(model).lora_targets);
  if (c) {
    c->peft_match = true;
    c->modules_to_save = {"classifier", "score"};
  }
  return c;
}

std::vector<std::string> seq2seq_lora_targets(const models::Seq2SeqConfig& model) {
  return models::family_of(model).lora_targets;
}

std::optional<nn::LoraConfig> seq2seq_lora_config(const Options& o, const Given& g,
                                                  const models::Seq2SeqConfig& model) {
  auto c = lora_config(o, g, seq2seq_lora_targets(model));
  if (c) c->peft_match = true;
  return c;
}

bool exports_lora_adapter(const std::optional<nn::LoraConfig>& lora, const Options& o) {
  return lora && lora->only_optimize_lora && !o.merge_lora;
}

std::string lora_adapter_base(const Options& o) {
  std::error_code ec;
  return o.init_from.empty() ? std::string()
                             : fs::absolute(o.init_from, ec).lexically_normal().string();
}

std::string export_seq2seq_lora_adapter(const models::Seq2Seq& model,
                                        const std::vector<std::pair<std::string, Tensor>>& weights,
                                        const nn::LoraConfig& c, const Options& o,
                                        const fs::path& dir) {
  const std::string base = lora_adapter_base(o);
  models::export_peft_seq2seq_adapter(model, weights, c, dir, base);
  return fmt::format(
      "{} (PEFT SEQ_2_SEQ_LM adapter: adapter_config.json + adapter_model.safetensors{})",
      dir.string(),
      base.empty() ? "; the base is this run's from-scratch model: --merge_lora exports it whole"
                   : "; base " + base);
}

std::string seq2seq_export_note(const std::optional<nn::LoraConfig>& lora, const Options& o,
                                bool with_tokenizer) {
  if (exports_lora_adapter(lora, o))
    return "PEFT SEQ_2_SEQ_LM adapter: adapter_config.json + adapter_model.safetensors; "
           "PeftModel.from_pretrained(AutoModelForSeq2SeqLM.from_pretrained(base), dir) reads it";
  return fmt::format(
      "config.json + model.safetensors{}{}; AutoModelForSeq2SeqLM.from_pretrained reads it, "
      "ds_generate --model too{}",
      with_tokenizer ? " + tokenizer" : " (no tokenizer)", lora ? ", LoRA merged" : "",
      with_tokenizer ? "" : " with --tokenizer");
}

LoraCounts count_lora(const models::GPTConfig& model, const nn::LoraConfig& c) {
  std::optional<models::GPT> shapes;
  {
    nn::PartitionedInit nothing_allocated;
    shapes.emplace(model, /*init=*/false);
  }
  LoraCounts n;
  int64_t adapted_weights = 0;
  for (const auto& [name, m] : shapes->named_modules()) {
    if (const auto* ex = dynamic_cast<const nn::MoEExperts*>(m)) {
      for (const Tensor* w : {&ex->gate_up_proj(), &ex->down_proj()}) {
        if (!nn::lora_selects_expert_weight(c, name,
                                            w == &ex->down_proj() ? "down_proj" : "gate_up_proj"))
          continue;
        n.lora_params += c.r * w->size(0) * (w->size(1) + w->size(2));  // A (r E, in), B (out, r E)
        adapted_weights += w->numel();
        ++n.expert_weights;
      }
      continue;
    }
    const auto* lin = dynamic_cast<const nn::Linear*>(m);
    if (!lin) continue;
    bool match = false;
    for (const auto& t : c.targets) match = match || nn::lora_target_matches(c, name, t);
    if (!match) continue;
    n.lora_params += c.r * (lin->in_features() + lin->out_features());
    adapted_weights += lin->weight().numel();
  }
  n.frozen = c.only_optimize_lora ? shapes->num_parameters() : adapted_weights;
  return n;
}

std::string describe_lora(const nn::LoraConfig& c, const nn::LoraReport& rep) {
  return fmt::format(
      "LoRA: r {}, alpha {:g} (scaling {:g}), dropout {:g}, {} modules matching {}; trainable {} "
      "of {} parameters ({:.2f}%){}",
      c.r, c.alpha, c.scaling(), c.dropout, rep.modules.size(), fmt::join(c.targets, ","),
      rep.trainable_params, rep.total_params,
      100.0 * static_cast<double>(rep.trainable_params) / static_cast<double>(rep.total_params),
      !c.only_optimize_lora       ? " (base weights of adapted modules frozen)"
      : c.modules_to_save.empty() ? ", only LoRA trained"
                                  : fmt::format(", only LoRA and the modules to save ({}) trained",
                                                fmt::join(c.modules_to_save, ", ")));
}

std::string export_lora(const models::GPT& model,
                        const std::vector<std::pair<std::string, Tensor>>& weights,
                        const nn::LoraConfig& c, bool merge, const std::filesystem::path& dir,
                        const std::string& base) {
  if (merge) {
    models::export_hf(model.config(), nn::merge_lora_weights(weights, c.scaling()), dir);
    return fmt::format("{} (LoRA merged into the base weights: config.json + model.safetensors)",
                       dir.string());
  }
  models::export_peft_adapter(model, weights, c, dir, base);
  return fmt::format(
      "{} (PEFT adapter: adapter_config.json + adapter_model.safetensors{})", dir.string(),
      base.empty() ? "; the base is this run's from-scratch model: --merge_lora exports it whole"
                   : "; base " + base);
}

}  // namespace ds::train
