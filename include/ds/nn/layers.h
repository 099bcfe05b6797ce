#pragma once
// Transformer layers as nn::Modules: Linear, Embedding, LayerNorm, RMSNorm, the two MLPs (GPT-2's
// GELU MLP and LLaMA's SwiGLU), causal self-attention in both layouts, and the pre-norm residual
// Block that composes them.
//
// Every layer holds the Tensor handles returned by register_parameter and reaches the data through
// them at the moment of use: flatten_parameters() and ZeRO-3 change a parameter's storage, never
// its TensorImpl, so the handles stay valid while raw pointers would not.
//
// Submodules are called through Module::operator() (never forward() directly) so that their hooks
// run: ZeRO-3 gathers a module's parameters in its forward pre-hook.
//
// Parameters are created zero-filled (norm weights one); models::GPT initialises them. Layer
// parameter names follow Hugging Face (see docs/models.md).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "ds/nn/decode.h"
#include "ds/nn/module.h"
#include "ds/nn/rope.h"

namespace ds::nn {

class TensorParallel;  // tensor_parallel.h
struct RouterLog;      // moe.h

// Which transformer family a block follows.
//   gpt2:  LayerNorm, fused c_attn (3C) + c_proj, GELU MLP (c_fc, c_proj), learned positions.
//   llama: RMSNorm, q/k/v/o_proj + rotary embeddings, SwiGLU MLP (gate/up/down_proj), no biases.
enum class Layout { gpt2, llama };
const char* layout_name(Layout l);               // "gpt2", "llama"
Layout layout_from_name(std::string_view name);  // throws "[model] unknown layout ..."

// What a Block needs to know (models::GPTConfig::block_config() fills it).
struct BlockConfig {
  Layout layout = Layout::gpt2;
  int64_t n_embd = 0;      // C
  int64_t n_head = 0;      // NH
  int64_t n_kv_head = 0;   // KV (llama): heads of K and V, NH % KV == 0; 0 = NH
  int64_t head_dim = 0;    // hd; 0 = C / NH (gpt2 requires that)
  int64_t ffn_hidden = 0;  // hidden width of the MLP (resolved: never 0 here)
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;    // llama only
  RopeScaling rope_scaling;       // llama only
  float dropout = 0.0f;           // after attention and MLP outputs, in training
  bool bias = true;               // biases in Linear layers (and, for gpt2, in LayerNorms)
  bool qkv_bias = false;          // llama: q/k/v_proj biases even without `bias` (Qwen2)
  bool qk_norm = false;           // llama: per-head RMSNorm of q and k before RoPE (Qwen3)
  int64_t rotary_dim = 0;         // llama: dims of each head that rotate (GLM: hd/2); 0 = hd
  bool rope_interleaved = false;  // llama: rotate pairs (2i, 2i+1), not (i, i + r/2) (GLM)
  bool sandwich_norm = false;     // llama: RMSNorm after attention and after the MLP too (GLM-4)
  // Gemma (llama layout): every RMSNorm scales by (1 + w) (weights stored as offsets from one),
  // the MLP's gate goes through gelu (tanh approximation: GeGLU) instead of silu, attention scores
  // are scaled by attn_scale (query_pre_attn_scalar^-0.5; 0 = 1/sqrt(hd)), and a layer with
  // sliding_window > 0 attends causally to its last sliding_window keys only (local layers);
  // attn_softcap > 0 soft-caps the scaled scores, cap * tanh(s / cap) (Gemma 2).
  bool norm_unit_offset = false;
  bool geglu = false;
  float attn_scale = 0.0f;
  int64_t sliding_window = 0;
  float attn_softcap = 0.0f;
  // Mixture of experts (llama layout, nn/moe.h): num_experts > 0 makes the block's MLP an MoEMLP
  // of num_experts SwiGLU experts of width moe_ffn_hidden, experts_per_tok per token, the chosen
  // routing weights renormalised to sum 1 when norm_topk_prob. router_log (the model's, may be
  // null) receives the router probabilities for the load-balancing loss.
  int64_t num_experts = 0;
  int64_t experts_per_tok = 0;
  int64_t moe_ffn_hidden = 0;
  bool norm_topk_prob = true;
  // Token dropping (DeepSpeed MoE; models::GPTConfig::moe_drop_tokens): capacity per expert
  // max(min_capacity, ceil(k N / E x factor)); off = dropless.
  bool drop_tokens = false;
  float capacity_factor = 1.0f, eval_capacity_factor = 1.0f;
  int64_t min_capacity = 4;
  std::shared_ptr<RouterLog> router_log;
  // Tensor parallelism (tensor_parallel.h): attention heads (and K/V heads), the MLP's hidden
  // width cut over tp->size() ranks; null = none. Shapes below are then the full model's.
  std::shared_ptr<TensorParallel> tp;

  int64_t resolved_kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t resolved_head_dim() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
  int64_t resolved_rotary_dim() const { return rotary_dim > 0 ? rotary_dim : resolved_head_dim(); }
};

// y = x @ W^T + b with W (out, in) like torch.nn.Linear. (Hugging Face's GPT-2 stores its Conv1D
// weights transposed, (in, out); a checkpoint importer must transpose c_attn/c_proj/c_fc.)
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  // A Linear over an existing weight (tied weights: the LM head reusing the token embedding).
  // The weight is registered here too; named_parameters() lists it once, under its first owner.
  explicit Linear(Tensor weight, Tensor bias = {});
  Tensor forward(const Tensor& x) override;  // (..., in) -> (..., out)
  // forward for inference steps (nn/decode.h), without hooks or dropout: ops::linear_rows when
  // `rows` or x is one row (each row computed as it would be alone), ops::linear otherwise; LoRA,
  // when present, added the same way.
  Tensor decode(const Tensor& x, bool rows) const;

  // The mean cross entropy of forward(x) against targets without forming the (..., out) outputs
  // (ops::linear_cross_entropy), the hooks run as for forward: x (..., in), targets (...) int ids.
  // Falls back to forward + ops::cross_entropy (same result) when fuses_cross_entropy() is false.
  // logit_bias (out), optional: a constant (no gradient) added to the outputs first.
  Tensor cross_entropy(const Tensor& x, const Tensor& targets, int64_t ignore_index = -100,
                       const Tensor& logit_bias = {});
  // Fused unless there is a bias or LoRA, or x is fp16 (its loss-scaled gradient would underflow
  // before the scale is applied; ops.h).
  bool fuses_cross_entropy(DType x_dtype) const;
  const Tensor& weight() const { return weight_; }  // (out, in)
  const Tensor& bias() const { return bias_; }      // (out) or undefined
  int64_t in_features() const { return weight_.size(1); }
  int64_t out_features() const { return weight_.size(0); }

  // LoRA (nn/lora.h applies it by module name): registers the children lora_A (Linear in -> r,
  // weight (r, in)) and lora_B (Linear r -> out, weight (out, r)), both without bias and
  // zero-filled, so the parameter names are PEFT's ("<module>.lora_A.weight"). forward then adds
  //   scaling * lora_B(lora_A(dropout(x, p)))
  // (dropout only in training and when p > 0). Throws if LoRA is already there.
  void add_lora(int64_t r, float scaling, float dropout);
  bool has_lora() const { return lora_A_ != nullptr; }
  const std::shared_ptr<Linear>& lora_A() const { return lora_A_; }  // weight (r, in)
  const std::shared_ptr<Linear>& lora_B() const { return lora_B_; }  // weight (out, r)
  float lora_scaling() const { return lora_scaling_; }

 private:
  Tensor weight_, bias_;
  std::shared_ptr<Linear> lora_A_, lora_B_;
  float lora_scaling_ = 0.0f, lora_dropout_ = 0.0f;
};

// out = weight[ids]: ids (...) int32/int64 -> (..., C). The input needs no gradient; the module's
// backward hook then fires at the end of the backward pass (see Module).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  Tensor forward(const Tensor& ids) override;
  const Tensor& weight() const { return weight_; }  // (V, C)

 private:
  Tensor weight_;
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, float eps = 1e-5f, bool bias = true);
  Tensor forward(const Tensor& x) override;  // (..., C) -> (..., C)
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }  // undefined when bias = false

 private:
  Tensor weight_, bias_;
  float eps_;
};

// x / rms(x) * w, or * (1 + w) with unit_offset (Gemma: the weight is stored as an offset from
// one and starts at zero).
class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, float eps = 1e-6f, bool unit_offset = false);
  Tensor forward(const Tensor& x) override;  // (..., C) -> (..., C)
  const Tensor& weight() const { return weight_; }
  bool unit_offset() const { return unit_offset_; }

 private:
  Tensor weight_;
  float eps_;
  bool unit_offset_ = false;
};

// A block's MLP: forward, and the same computation for an inference step (nn/decode.h).
class FeedForward : public Module {
 public:
  // x (1, N, C) -> (1, N, C); rows as Linear::decode.
  virtual Tensor decode(const Tensor& x, bool rows) const = 0;

 protected:
  using Module::Module;
};

// GPT-2 MLP: c_proj(gelu(c_fc(x))), hidden = ffn_hidden (4C by default), then dropout.
class MLP : public FeedForward {
 public:
  explicit MLP(const BlockConfig& cfg);
  Tensor forward(const Tensor& x) override;  // (B, T, C) -> (B, T, C)
  Tensor decode(const Tensor& x, bool rows) const override;

 private:
  std::shared_ptr<Linear> c_fc_, c_proj_;
  float dropout_;
};

// LLaMA MLP: down_proj(silu(gate_proj(x)) * up_proj(x)), then dropout; with cfg.geglu, gelu (tanh
// approximation, Gemma's gelu_pytorch_tanh) in place of silu.
class SwiGLUMLP : public FeedForward {
 public:
  explicit SwiGLUMLP(const BlockConfig& cfg);
  Tensor forward(const Tensor& x) override;  // (B, T, C) -> (B, T, C)
  Tensor decode(const Tensor& x, bool rows) const override;

 private:
  std::shared_ptr<Linear> gate_proj_, up_proj_, down_proj_;
  float dropout_;
  bool geglu_ = false;
  Tensor act(const Tensor& gate, const Tensor& up) const;  // (.., H) x 2 -> (.., H)
};

// Causal multi-head self-attention, scale 1/sqrt(hd), in two classes, one per family of weight
// layouts. Dropout applies to the output projection (GPT-2's resid_dropout). Dropout on the
// attention probabilities (GPT-2's attn_dropout) is not supported: the fused kernel never forms
// them.
//
// Both derive from SelfAttention, whose decode() is the same attention for an inference step
// (nn/decode.h): the new rows' keys and values go into each sequence's cache and its queries attend
// to every cached position (nn::attend_cached), the projections running once over all rows.
class SelfAttention : public Module {
 public:
  // x (1, N, C), the rows of every sequence of the step -> (1, N, C).
  virtual Tensor decode(const Tensor& x, const DecodeStep& step) const = 0;

 protected:
  using Module::Module;
};

// GPT-2's: qkv = c_attn(x) (B, T, 3C) split as [q | k | v], each head a contiguous hd slice;
// y = c_proj(attention). NH * hd == C, no grouped-query attention, no rotary embedding.
class FusedQKVAttention : public SelfAttention {
 public:
  explicit FusedQKVAttention(const BlockConfig& cfg);
  Tensor forward(const Tensor& x) override;  // (B, T, C) -> (B, T, C)
  Tensor decode(const Tensor& x, const DecodeStep& step) const override;

 private:
  int64_t n_embd_, n_head_, head_dim_;
  float dropout_;
  std::shared_ptr<Linear> c_attn_, c_proj_;
};

// The LLaMA family's: q_proj (C -> NH*hd), k/v_proj (C -> KV*hd; grouped-query attention when
// KV < NH: query head h reads K/V head h / (NH/KV), as Hugging Face's repeat_kv), optional
// per-head q_norm/k_norm (RMSNorm over hd, Qwen3), RoPE on q and k (positions 0..T-1, rotate_half
// pairs (i, i + hd/2), frequencies from nn::rope_inv_freq; GLM: only the first rotary_dim dims,
// pairs (2i, 2i+1)), y = o_proj (NH*hd -> C). Scores scaled by cfg.attn_scale (1/sqrt(hd) when 0);
// with cfg.sliding_window > 0 each query sees its last sliding_window keys (ops::AttentionMask).
class GroupedQueryAttention : public SelfAttention {
 public:
  explicit GroupedQueryAttention(const BlockConfig& cfg);
  Tensor forward(const Tensor& x) override;  // (B, T, C) -> (B, T, C)
  Tensor decode(const Tensor& x, const DecodeStep& step) const override;

 private:
  int64_t n_embd_, n_head_, n_kv_head_, head_dim_;
  float dropout_;
  // The rotary table of a sequence of seq_len (largest position + 1): longrope's long one past
  // rope_long_after_, else rope_inv_freq_.
  const std::vector<double>& inv_freq_for(int64_t seq_len) const;

  std::vector<double> rope_inv_freq_;       // (rotary_dim/2)
  std::vector<double> rope_inv_freq_long_;  // (rotary_dim/2), longrope only
  int64_t rope_long_after_ = 0;             // longrope's original_max_position; 0 = one table
  bool rope_interleaved_ = false;
  float rope_scale_ = 1.0f;  // yarn's and longrope's attention factor on cos/sin
  float attn_scale_ = 0.0f;  // 0: 1/sqrt(hd)
  int64_t window_ = 0;       // sliding window; 0 = every earlier key
  float softcap_ = 0.0f;     // attention logit soft-capping; 0 = none
  std::shared_ptr<Linear> q_proj_, k_proj_, v_proj_, o_proj_;
  std::shared_ptr<RMSNorm> q_norm_, k_norm_;  // qk_norm
};

// An indexed list of modules, named "0", "1", ... (Hugging Face's h.{i} / layers.{i}).
class ModuleList : public Module {
 public:
  // Children are named first_index, first_index + 1, ...: a pipeline stage holding blocks 4..7 of
  // a model keeps the whole model's names (h.4 ... h.7).
  explicit ModuleList(int64_t first_index = 0) : Module("ModuleList"), first_(first_index) {}
  template <class M>
  std::shared_ptr<M> append(std::shared_ptr<M> m) {
    return register_module(std::to_string(first_ + size_++), std::move(m));
  }
  int64_t size() const { return size_; }

 private:
  int64_t first_ = 0;
  int64_t size_ = 0;
};

// Pre-norm residual block, the base of each family's block:
//   x = x + attn(norm_1(x));  x = x + mlp(norm_2(x))
// or with sandwich norms (GLM-4), each branch normalised again before its residual add:
//   x = x + norm_3(attn(norm_1(x)));  x = x + norm_4(mlp(norm_2(x)))
// A family's block registers its modules under its Hugging Face names; models hold blocks as
// Block and make them with make_block(). With gradient checkpointing on (Module), the whole block
// is recomputed in backward. decode() is the same block for an inference step (nn/decode.h; the
// step's rows, this block's caches): models::GPTDecoder runs every family through it.
class Block : public Module {
 public:
  Tensor forward(const Tensor& x) override;  // (B, T, C) -> (B, T, C)
  Tensor decode(const Tensor& x, const DecodeStep& step) const;  // (1, N, C) -> (1, N, C)

 protected:
  explicit Block(const char* type) : Module(type) {}
  std::shared_ptr<Module> norm_1_, norm_2_;
  std::shared_ptr<SelfAttention> attn_;
  std::shared_ptr<FeedForward> mlp_;
  std::shared_ptr<Module> norm_3_, norm_4_;  // sandwich norms only
};

// GPT-2: ln_1 (LayerNorm) / attn (FusedQKVAttention) / ln_2 / mlp (MLP).
class GPT2Block final : public Block {
 public:
  explicit GPT2Block(const BlockConfig& cfg);
};

// LLaMA, Mistral, Qwen2/3, GLM, Mixtral: input_layernorm (RMSNorm) / self_attn
// (GroupedQueryAttention) / post_attention_layernorm / mlp (SwiGLUMLP, or MoEMLP with
// cfg.num_experts > 0), plus post_self_attn_layernorm and post_mlp_layernorm
// with sandwich_norm (GLM-4).
class LlamaBlock final : public Block {
 public:
  explicit LlamaBlock(const BlockConfig& cfg);
};

// The block of cfg.layout (the one place a layout picks classes).
std::shared_ptr<Block> make_block(const BlockConfig& cfg);

}  // namespace ds::nn
