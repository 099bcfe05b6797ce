#include "ds/nn/lora.h"

#include <cmath>
#include <map>

#include "ds/autograd/grad_mode.h"
#include "ds/core/error.h"
#include "ds/core/rng.h"
#include "ds/nn/layers.h"
#include "ds/nn/moe.h"
#include "ds/ops/ops.h"

namespace ds::nn {
namespace {

constexpr uint64_t kLoraStream = 0x4c6f5241ULL << 16;  // "LoRA": A's init streams start here

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void LoraConfig::validate() const {
  DS_CHECK(r > 0, "[lora] lora_dim (r) must be positive, got {}", r);
  DS_CHECK(alpha > 0.0f && std::isfinite(alpha), "[lora] lora_alpha must be positive, got {}",
           alpha);
  DS_CHECK(dropout >= 0.0f && dropout < 1.0f, "[lora] lora_dropout must be in [0, 1), got {}",
           dropout);
  DS_CHECK(!targets.empty(),
           "[lora] no target modules: give lora_module_name (e.g. q_proj,v_proj for LLaMA, c_attn "
           "for GPT-2)");
  for (const auto& t : targets)
    DS_CHECK(!t.empty(), "[lora] an empty target module name (a stray comma in lora_module_name?)");
}

bool lora_target_matches(const LoraConfig& config, const std::string& name,
                         const std::string& target) {
  if (!config.peft_match) return name.find(target) != std::string::npos;
  return name == target || ends_with(name, "." + target);
}

bool in_modules_to_save(const LoraConfig& config, const std::string& name) {
  // Every enclosing module path of the parameter: "classifier.dense.weight" -> "classifier",
  // "classifier.dense".
  for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', dot + 1)) {
    const std::string module = name.substr(0, dot);
    for (const auto& m : config.modules_to_save)
      if (module == m || ends_with(module, "." + m)) return true;
  }
  return false;
}

bool is_lora_parameter(const std::string& name) {
  return ends_with(name, ".lora_A.weight") || ends_with(name, ".lora_B.weight") ||
         name == "lora_A.weight" || name == "lora_B.weight";
}

void check_lora_targets_not_experts(Module& root, const LoraConfig& config) {
  for (const auto& [name, m] : root.named_modules()) {
    if (!dynamic_cast<const MoEExperts*>(m)) continue;
    for (const auto& t : config.targets) {
      bool hit = lora_target_matches(config, name, t);
      // The stacked weights by their own name, or as PEFT's target_parameters names them
      // ("mlp.experts.gate_up_proj" matches by suffix).
      for (const std::string leaf : {"gate_up_proj", "down_proj"})
        hit = hit || t == leaf || ends_with(name + "." + leaf, "." + t);
      DS_CHECK(!hit,
               "[lora] lora_module_name '{}' selects the mixture-of-experts weights of '{}' "
               "(stacked experts.gate_up_proj (E, 2I, C) and experts.down_proj (E, C, I), which "
               "PEFT adapts through target_parameters): LoRA on experts is not supported. "
               "Targets that work on this model: the attention projections q_proj, k_proj, "
               "v_proj, o_proj and the router gate (mlp.gate)",
               t, name);
    }
  }
}

LoraReport apply_lora(Module& root, const LoraConfig& config) {
  config.validate();
  check_lora_targets_not_experts(root, config);
  // Where each parameter is listed (its first owner), to tell tied weights apart.
  std::map<const TensorImpl*, std::string> listed;
  for (const auto& [name, p] : root.named_parameters()) listed.emplace(p.impl(), name);

  LoraReport rep;
  std::vector<std::string> linears;
  std::vector<Linear*> chosen;
  for (const auto& [name, m] : root.named_modules()) {
    auto* lin = dynamic_cast<Linear*>(m);
    if (!lin || is_lora_parameter(name + ".weight")) continue;
    linears.push_back(name);
    bool match = false;
    for (const auto& t : config.targets) match = match || lora_target_matches(config, name, t);
    if (!match) continue;
    DS_CHECK(!lin->has_lora(), "[lora] module '{}' already has LoRA", name);
    const std::string own = name.empty() ? "weight" : name + ".weight";
    DS_CHECK(listed.at(lin->weight().impl()) == own,
             "[lora] module '{}' shares its weight with '{}' (tied weights); LoRA on it would "
             "change both: leave it out of lora_module_name",
             name, listed.at(lin->weight().impl()));
    DS_CHECK(lin->weight().is_materialized(),
             "[lora] module '{}' holds no weight data (built under nn::PartitionedInit?); build "
             "the model whole before applying LoRA",
             name);
    chosen.push_back(lin);
    rep.modules.push_back(name);
  }
  if (chosen.empty()) {
    std::string some;
    for (size_t i = 0; i < linears.size() && i < 6; ++i) some += (i ? ", " : "") + linears[i];
    DS_THROW(
        "[lora] no Linear module name {} of lora_module_name '{}'; the model's Linear modules "
        "are e.g. {}",
        config.peft_match ? "is, or ends in '.' and, one (PEFT's target_modules rule)"
                          : "contains any",
        fmt::join(config.targets, ","), some);
  }

  if (config.only_optimize_lora)
    for (auto& [name, p] : root.named_parameters())
      p.set_requires_grad(in_modules_to_save(config, name));
  for (size_t k = 0; k < chosen.size(); ++k) {
    Linear* lin = chosen[k];
    Tensor base = lin->weight();
    base.set_requires_grad(false);  // DeepSpeed-Chat always freezes the base weight
    lin->add_lora(config.r, config.scaling(), config.dropout);
    // PEFT's kaiming_uniform_(a = sqrt(5)): bound = gain * sqrt(3 / fan_in), gain = sqrt(2 / 6).
    const Tensor& a = lin->lora_A()->weight();  // (r, in), fresh fp32 zeros
    const int64_t in = a.size(1);
    const float bound = 1.0f / std::sqrt(static_cast<float>(in));
    float* av = a.data<float>();
    for (int64_t i = 0; i < a.numel(); ++i)
      av[i] = bound * (2.0f * rng::uniform01(rng::hash3(config.seed, kLoraStream + k,
                                                        static_cast<uint64_t>(i))) -
                       1.0f);
    rep.lora_params += a.numel() + lin->lora_B()->weight().numel();
  }
  for (const auto& [name, p] : root.named_parameters()) {
    rep.total_params += p.numel();
    if (p.requires_grad()) rep.trainable_params += p.numel();
  }
  return rep;
}

std::vector<std::pair<std::string, Tensor>> merge_lora_weights(
    const std::vector<std::pair<std::string, Tensor>>& named_weights, float scaling) {
  autograd::NoGradGuard no_grad;
  std::map<std::string, Tensor> lora;
  for (const auto& [name, t] : named_weights)
    if (is_lora_parameter(name)) lora.emplace(name, t);
  std::vector<std::pair<std::string, Tensor>> out;
  size_t merged = 0;
  for (const auto& [name, t] : named_weights) {
    if (is_lora_parameter(name)) continue;
    if (!ends_with(name, "weight")) {
      out.emplace_back(name, t);
      continue;
    }
    const std::string prefix = name.substr(0, name.size() - 6);  // "<module>." or ""
    auto a = lora.find(prefix + "lora_A.weight"), b = lora.find(prefix + "lora_B.weight");
    if (a == lora.end() && b == lora.end()) {
      out.emplace_back(name, t);
      continue;
    }
    DS_CHECK(a != lora.end() && b != lora.end(), "[lora] {}: only one of lora_A / lora_B is there",
             prefix);
    const Tensor& A = a->second;  // (r, in)
    const Tensor& B = b->second;  // (out, r)
    DS_CHECK(t.dim() == 2 && A.dim() == 2 && B.dim() == 2 && B.size(1) == A.size(0) &&
                 B.size(0) == t.size(0) && A.size(1) == t.size(1),
             "[lora] {}: weight {} does not match lora_A {} and lora_B {}", name,
             shape_str(t.shape()), shape_str(A.shape()), shape_str(B.shape()));
    const Tensor delta = ops::matmul(B.to(DType::f32).contiguous(), A.to(DType::f32).contiguous());
    const Tensor w = ops::add(t.to(DType::f32).contiguous(), ops::mul(delta, scaling));
    out.emplace_back(name, w.to(t.dtype()));
    merged += 2;
  }
  DS_CHECK(merged == lora.size(), "[lora] {} LoRA matrices have no base weight to merge into",
           lora.size() - merged);
  return out;
}

}  // namespace ds::nn
