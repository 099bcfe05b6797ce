#pragma once
// Mixture-of-experts feed-forward (Mixtral's MixtralSparseMoeBlock, Qwen3-MoE's
// Qwen3MoeSparseMoeBlock): a router picks experts_per_tok SwiGLU experts per token and the block
// returns their outputs weighted by the routing weights. Parameter names are transformers 5's:
//
//   gate.weight                (E, C)       the router (Linear C -> E, no bias)
//   experts.gate_up_proj       (E, 2I, C)   expert e's [gate_proj; up_proj] rows
//   experts.down_proj          (E, C, I)    expert e's down_proj
//
// The computation is grouped by expert, without a loop over tokens in the math:
//   probs  = softmax(fp32(gate(x)))                         (N, E)
//   top-k experts per token (on the host: indices take no gradient), weights = probs at them,
//   renormalised to sum 1 when norm_topk_prob (Mixtral always)  (N, k)
//   rows sorted by expert: xs = x[order] (M = N k, C); expert e's GEMMs on its run of rows;
//   back to token order: y = sum_k weight(n, k) * ys[back(n, k)]            (N, C)
// The gathers are ops::embedding of the activations (backward: a scatter-add), so gradients reach
// the router through the softmax and the weights, and every expert's rows through one GEMM each.
// Experts that receive no token get a zero gradient (as transformers, which skips them).
// Dropless by default; BlockConfig::drop_tokens caps each expert's choices (DeepSpeed MoE's
// capacity), a dropped choice then adding nothing.
//
// Threading: a module; one forward at a time per instance (the router log is written in forward).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ds/comm/group.h"
#include "ds/nn/layers.h"

namespace ds::nn {

class ExpertLora;  // nn/expert_lora.h

// What the MoE layers of one forward record for the router's load-balancing loss (transformers'
// load_balancing_loss_func). Owned by the model (models::GPT), shared with its MoE layers; layers
// record only while `enabled`.
struct RouterLog {
  bool enabled = false;
  std::vector<Tensor> probs;  // per MoE layer: softmax of the router logits (N, E) fp32, with graph
  std::vector<int64_t> counts;  // (E): top-k assignments per expert, summed over layers
  void clear() {
    probs.clear();
    counts.clear();
  }
};

// transformers' load_balancing_loss_func without an attention mask, over every recorded layer:
//   f_e = counts_e / (L N)   (a constant: top-k takes no gradient)
//   P_e = sum_l sum_n probs_l[n, e] / (L N)
//   loss = E * sum_e f_e P_e
// A scalar fp32 tensor on the probabilities' device; throws when nothing was recorded.
Tensor load_balancing_loss(const RouterLog& log);

// The experts' stacked weights; forward(xs) runs expert e on rows [off_e, off_e + counts[e]) of
// xs (M, C) (rows sorted by expert; set_counts first) and returns (M, C) in the same order.
class MoEExperts : public Module {
 public:
  MoEExperts(int64_t num_experts, int64_t n_embd, int64_t hidden);
  void set_counts(std::vector<int64_t> counts) { counts_ = std::move(counts); }
  Tensor forward(const Tensor& xs) override;  // (M, C) -> (M, C)
  // forward's arithmetic for given counts (no hooks; the decode path).
  Tensor compute(const Tensor& xs, const std::vector<int64_t>& counts) const;
  const Tensor& gate_up_proj() const { return gate_up_; }  // (E, 2I, C)
  const Tensor& down_proj() const { return down_; }        // (E, C, I)

  // LoRA on one stacked weight, "gate_up_proj" or "down_proj" (nn/expert_lora.h, applied by
  // nn::apply_lora): registers the child ExpertLora under that name; forward and compute then run
  // the GEMMs on W + scaling * delta. Throws if the weight has LoRA already, is unknown, or the
  // experts were split (expert parallelism). Returns the new module.
  std::shared_ptr<ExpertLora> add_lora(const std::string& weight, int64_t r, float scaling);
  const std::shared_ptr<ExpertLora>& gate_up_lora() const { return gate_up_lora_; }  // or null
  const std::shared_ptr<ExpertLora>& down_lora() const { return down_lora_; }        // or null

  // Expert parallelism (expert_parallel.h): keeps experts [begin, end) of the layer's total
  // (the parameters' storage is replaced in place by that slice: their handles stay valid);
  // E above is then end - begin. Once.
  void keep(int64_t begin, int64_t end);
  bool sharded() const { return E_ != total_; }
  int64_t num_experts() const { return E_; }        // held here
  int64_t total_experts() const { return total_; }  // in the layer
  int64_t first_expert() const { return first_; }   // global index of the first held

 private:
  int64_t E_, C_, I_;
  int64_t total_, first_ = 0;
  Tensor gate_up_, down_;
  std::shared_ptr<ExpertLora> gate_up_lora_, down_lora_;  // null without LoRA
  std::vector<int64_t> counts_;
  // The GEMMs on given (possibly LoRA-adapted) weights.
  Tensor run(const Tensor& xs, const std::vector<int64_t>& counts, const Tensor& gate_up,
             const Tensor& down) const;
};

// The MoE block's feed-forward: (B, T, C) -> (B, T, C). cfg.num_experts experts of hidden width
// cfg.moe_ffn_hidden, cfg.experts_per_tok per token; no tensor parallelism, no biases. With
// cfg.shared_expert_hidden > 0 (Qwen2-MoE) it adds sigmoid(shared_expert_gate(x)) *
// shared_expert(x): parameters shared_expert.{gate,up,down}_proj.weight and
// shared_expert_gate.weight (1, C).
class MoEMLP : public FeedForward {
 public:
  explicit MoEMLP(const BlockConfig& cfg);
  Tensor forward(const Tensor& x) override;                  // (B, T, C) -> (B, T, C)
  Tensor decode(const Tensor& x, bool rows) const override;  // (1, N, C) -> (1, N, C)

  // Splits the experts over `group` (expert_parallel.h): this rank keeps experts
  // [r E / ep, (r + 1) E / ep) and forward exchanges rows with the group's ranks. Throws unless
  // ep divides E. A group of one changes nothing. Once.
  void set_expert_parallel(std::shared_ptr<comm::Group> group);

 private:
  int64_t E_, k_;
  bool norm_topk_;
  bool drop_tokens_;  // capacity(): BlockConfig::drop_tokens and its factors
  float capacity_factor_, eval_capacity_factor_;
  int64_t min_capacity_;
  float dropout_;
  std::shared_ptr<Linear> gate_;
  std::shared_ptr<MoEExperts> experts_;
  // Qwen2-MoE's shared expert and its gate (BlockConfig::shared_expert_hidden; null without).
  std::shared_ptr<SwiGLUMLP> shared_;
  std::shared_ptr<Linear> shared_gate_;
  std::shared_ptr<RouterLog> log_;
  std::shared_ptr<comm::Group> ep_;  // set_expert_parallel(); null: every expert here
  int64_t calls_ = 0;                // forwards under expert parallelism (names collectives)
  // xs (M, C) sorted by expert with counts (E): through this rank's experts, or with expert
  // parallelism through the group's (dispatch, experts, combine). (M, C), xs's order.
  Tensor run_experts(const Tensor& xs, const std::vector<int64_t>& counts);
  // x2 (N, C) -> sigmoid(shared_expert_gate(x2)) * shared_expert(x2) (N, C).
  Tensor shared(const Tensor& x2, bool decode, bool rows) const;
  // Choices each expert keeps of `tokens` tokens' top-k; -1: every one (dropless).
  int64_t capacity(int64_t tokens, bool training) const;
  // x2 (N, C), router logits (N, E) -> (N, C); experts(xs, counts) runs the experts; capacity as
  // capacity() gives it.
  template <class Experts>
  Tensor mix(const Tensor& x2, const Tensor& logits, Experts&& experts, bool record,
             int64_t capacity) const;
};

}  // namespace ds::nn
