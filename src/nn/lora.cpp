#include "ds/nn/lora.h"

#include <cmath>
#include <map>

#include "ds/autograd/grad_mode.h"
#include "ds/core/error.h"
#include "ds/core/rng.h"
#include "ds/nn/expert_lora.h"
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

bool lora_selects_expert_weight(const LoraConfig& config, const std::string& experts,
                                const std::string& weight) {
  const std::string full = experts.empty() ? weight : experts + "." + weight;
  for (const auto& t : config.targets)
    if (lora_target_matches(config, experts, t) || t == weight || ends_with(full, "." + t))
      return true;
  return false;
}

namespace {

// A's initialisation as PEFT's (kaiming_uniform_ with a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in)))
// from stream `k` of the config's seed; `a` (rows, in) fp32.
void init_lora_A(const Tensor& a, const LoraConfig& config, uint64_t k) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(a.size(1)));
  float* av = a.data<float>();
  for (int64_t i = 0; i < a.numel(); ++i)
    av[i] =
        bound *
        (2.0f * rng::uniform01(rng::hash3(config.seed, kLoraStream + k, static_cast<uint64_t>(i))) -
         1.0f);
}

// The stacked expert weights the config selects: (experts module, weight name).
std::vector<std::pair<MoEExperts*, std::string>> chosen_expert_weights(
    Module& root, const LoraConfig& config, std::vector<std::string>& names) {
  std::vector<std::pair<MoEExperts*, std::string>> out;
  for (const auto& [name, m] : root.named_modules()) {
    auto* ex = dynamic_cast<MoEExperts*>(m);
    if (!ex) continue;
    for (const std::string w : {"gate_up_proj", "down_proj"}) {
      if (!lora_selects_expert_weight(config, name, w)) continue;
      DS_CHECK(config.dropout == 0.0f,
               "[lora] lora_dropout {} with LoRA on the experts' {} ('{}'): peft's "
               "target_parameters (ParamWrapper) have no dropout; give lora_dropout 0",
               config.dropout, w, name);
      DS_CHECK(!ex->sharded(),
               "[lora] LoRA on the experts of '{}' with expert parallelism is not supported; "
               "train without expert_parallel.autoep_size",
               name);
      const Tensor& base = w == "gate_up_proj" ? ex->gate_up_proj() : ex->down_proj();
      DS_CHECK(base.is_materialized(),
               "[lora] '{}.{}' holds no weight data (built under nn::PartitionedInit?); build the "
               "model whole before applying LoRA",
               name, w);
      out.emplace_back(ex, w);
      names.push_back(name + "." + w);
    }
  }
  return out;
}

}  // namespace

LoraReport apply_lora(Module& root, const LoraConfig& config) {
  config.validate();
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
  const auto experts = chosen_expert_weights(root, config, rep.modules);
  if (chosen.empty() && experts.empty()) {
    std::string some;
    for (size_t i = 0; i < linears.size() && i < 6; ++i) some += (i ? ", " : "") + linears[i];
    DS_THROW(
        "[lora] no Linear module name {} of lora_module_name '{}' (nor does any select a "
        "mixture of experts' stacked weight); the model's Linear modules are e.g. {}",
        config.peft_match ? "is, or ends in '.' and, one (PEFT's target_modules rule)"
                          : "contains any",
        fmt::join(config.targets, ","), some);
  }

  if (config.only_optimize_lora)
    for (auto& [name, p] : root.named_parameters())
      p.set_requires_grad(in_modules_to_save(config, name));
  uint64_t k = 0;
  for (Linear* lin : chosen) {
    lin->weight().set_requires_grad(false);  // DeepSpeed-Chat always freezes the base weight
    lin->add_lora(config.r, config.scaling(), config.dropout);
    init_lora_A(lin->lora_A()->weight(), config, k++);
    rep.lora_params += lin->lora_A()->weight().numel() + lin->lora_B()->weight().numel();
  }
  for (const auto& [ex, w] : experts) {
    (w == "gate_up_proj" ? ex->gate_up_proj() : ex->down_proj()).set_requires_grad(false);
    const auto lora = ex->add_lora(w, config.r, config.scaling());
    init_lora_A(lora->lora_A(), config, k++);
    rep.lora_params += lora->lora_A().numel() + lora->lora_B().numel();
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
    // A Linear's "<module>.weight" has "<module>.lora_A.weight"; a stacked expert weight
    // "<experts>.gate_up_proj" has "<experts>.gate_up_proj.lora_A.weight".
    const std::string prefix =
        ends_with(name, "weight") ? name.substr(0, name.size() - 6) : name + ".";
    auto a = lora.find(prefix + "lora_A.weight"), b = lora.find(prefix + "lora_B.weight");
    if (a == lora.end() && b == lora.end()) {
      out.emplace_back(name, t);
      continue;
    }
    DS_CHECK(a != lora.end() && b != lora.end(), "[lora] {}: only one of lora_A / lora_B is there",
             prefix);
    const Tensor& A = a->second;  // (r, in); experts: (r E, in)
    const Tensor& B = b->second;  // (out, r); experts: (out, r E)
    if (t.dim() == 3) {
      DS_CHECK(B.size(0) == t.size(1) && A.size(1) == t.size(2),
               "[lora] {}: weight {} does not match lora_A {} and lora_B {}", name,
               shape_str(t.shape()), shape_str(A.shape()), shape_str(B.shape()));
      const Tensor delta = expert_lora_delta(A, B, t.size(0));  // (E, out, in) fp32
      const Tensor w = ops::add(t.to(DType::f32).contiguous(), ops::mul(delta, scaling));
      out.emplace_back(name, w.to(t.dtype()));
      merged += 2;
      continue;
    }
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
