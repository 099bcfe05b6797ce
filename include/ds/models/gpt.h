#pragma once
// GPT-style language models in two layouts (GPT-2 and LLaMA), configured by GPTConfig (presets by
// name, or a JSON file). Parameter names follow Hugging Face so that checkpoints can be imported:
//
//   gpt2:  wte.weight, wpe.weight, h.{i}.ln_1.{weight,bias}, h.{i}.attn.c_attn.{weight,bias},
//          h.{i}.attn.c_proj.{weight,bias}, h.{i}.ln_2.{weight,bias}, h.{i}.mlp.c_fc.{weight,bias},
//          h.{i}.mlp.c_proj.{weight,bias}, ln_f.{weight,bias}; the LM head is tied to wte.
//   llama: embed_tokens.weight, layers.{i}.input_layernorm.weight,
//          layers.{i}.self_attn.{q,k,v,o}_proj.weight (+ q/k/v .bias with qkv_bias or bias),
//          layers.{i}.self_attn.{q,k}_norm.weight (qk_norm),
//          layers.{i}.post_attention_layernorm.weight, layers.{i}.mlp.{gate,up,down}_proj.weight,
//          norm.weight, lm_head.weight (untied). The llama layout covers LLaMA 2/3, Mistral, Qwen2,
//          Qwen3, GLM and Gemma 3 (family picks the Hugging Face class an export names):
//          grouped-query attention (n_kv_head), a head size other than C / NH (head_size), rope
//          scaling, q/k/v biases, per-head q/k RMSNorm, sandwich norms, per-layer sliding windows,
//          Gemma's (1 + w) norms, GeGLU and scaled embeddings.
//
// Our Linear weights are (out, in) like torch.nn.Linear. Hugging Face's GPT-2 uses Conv1D, whose
// weights are stored (in, out): an importer transposes c_attn, c_proj and c_fc weights.
// docs/models.md has the presets, the initialisation and how parity with PyTorch is checked.
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <vector>

#include "ds/nn/layers.h"
#include "ds/nn/module.h"
#include "ds/nn/moe.h"
#include "ds/nn/pipeline_stage.h"
#include "ds/nn/tensor_parallel.h"

namespace ds::models {

struct GPTConfig {
  nn::Layout layout = nn::Layout::gpt2;
  int64_t vocab_size = 50257;  // V
  int64_t block_size = 1024;   // maximum sequence length T
  int64_t n_layer = 12;        // L
  int64_t n_head = 12;         // NH
  int64_t n_embd = 768;        // C
  // MLP hidden width; 0 = the layout's default: 4C for gpt2; for llama 2/3 * 4C rounded up to a
  // multiple of ffn_multiple_of (LLaMA's rule: C 4096 -> 11008).
  int64_t ffn_hidden = 0;
  int64_t ffn_multiple_of = 256;
  float norm_eps = 1e-5f;       // 1e-5 gpt2 (LayerNorm), 1e-6 llama (RMSNorm)
  float rope_theta = 10000.0f;  // llama
  float dropout = 0.0f;         // embeddings, attention output, MLP output (training only)
  bool bias = true;             // Linear (and gpt2 LayerNorm) biases; llama: false
  bool tie_embeddings = true;   // LM head shares the token embedding; llama: false
  uint64_t seed = 0;            // parameter initialisation
  // ---- llama layout only (JSON writes them only when they differ from these defaults) ----
  int64_t n_kv_head = 0;         // KV heads of grouped-query attention; 0 = n_head
  int64_t head_size = 0;         // hd; 0 = n_embd / n_head
  bool qkv_bias = false;         // q/k/v_proj biases while o_proj and the MLP have none (Qwen2)
  bool qk_norm = false;          // per-head RMSNorm of q and k before RoPE (Qwen3)
  nn::RopeScaling rope_scaling;  // JSON "rope_scaling": {"type": ..., ...}; see ds/nn/rope.h
  // Sliding-window attention: 0 = none. With layer_types empty (Mistral) it covers every layer and
  // is only recorded: it must be >= block_size, where it changes nothing (the importer lowers
  // block_size to the window; see hf_io.h). With layer_types, the layers named
  // "sliding_attention" attend to their last sliding_window keys (Gemma's local layers).
  int64_t sliding_window = 0;
  // One entry per layer, "full_attention" or "sliding_attention"; empty = every layer alike.
  std::vector<std::string> layer_types;
  // Rotary base of the sliding_attention layers (Gemma's rope_local_base_freq), which take no
  // rope_scaling; 0 = rope_theta and rope_scaling like every other layer.
  float rope_local_theta = 0.0f;
  // Gemma: RMSNorms scale by (1 + w) (weights start at zero), GeGLU MLP (gelu, tanh
  // approximation), token embeddings multiplied by sqrt(n_embd) (rounded to the embedding's
  // dtype), attention scores scaled by query_pre_attn_scalar^-0.5 (0 = 1/sqrt(head_dim)).
  bool norm_unit_offset = false;
  bool geglu = false;
  bool embed_scale = false;
  float query_pre_attn_scalar = 0.0f;
  // Gemma 2's soft-capping, cap * tanh(x / cap): of the attention scores (every layer) and of the
  // logits; 0 = none. The capped logits' loss is not fused (ops::linear_cross_entropy): the head
  // forms the (B*T, V) logits.
  float attn_logit_softcapping = 0.0f;
  float final_logit_softcapping = 0.0f;
  // GLM: rotary embedding on the first head_size * partial_rotary_factor dims of each head only,
  // rotating pairs (2i, 2i+1) when rope_interleaved (ChatGLM's layout); GLM-4's sandwich_norm adds
  // an RMSNorm after attention and after the MLP (post_self_attn_layernorm, post_mlp_layernorm).
  float partial_rotary_factor = 1.0f;
  bool rope_interleaved = false;
  bool sandwich_norm = false;
  // Mixture of experts (llama layout; nn/moe.h; Mixtral, Qwen3-MoE): num_experts > 0 replaces every
  // block's MLP by a router over num_experts SwiGLU experts of width moe_ffn_hidden (0 =
  // resolved_ffn_hidden()), experts_per_tok of them per token, their routing weights renormalised
  // to sum 1 when norm_topk_prob. output_router_logits adds router_aux_loss_coef times the
  // router's load-balancing loss (transformers' load_balancing_loss_func) to loss().
  int64_t num_experts = 0;
  int64_t experts_per_tok = 2;
  int64_t moe_ffn_hidden = 0;
  bool norm_topk_prob = true;
  float router_aux_loss_coef = 0.001f;
  bool output_router_logits = false;
  // DeepSpeed MoE's token dropping (deepspeed.moe.layer.MoE's drop_tokens, capacity_factor,
  // eval_capacity_factor, min_capacity): with moe_drop_tokens each expert takes at most
  // max(moe_min_capacity, ceil(k N / E x factor)) of a forward's N tokens (this rank's), first
  // choices before second ones, each in token order; a dropped choice adds nothing and the
  // others' weights are renormalised (norm_topk_prob). Off (the default) is dropless, as
  // transformers computes. Training forwards use moe_capacity_factor, evaluation
  // moe_eval_capacity_factor; generation (the KV-cache decoder) is always dropless.
  bool moe_drop_tokens = false;
  float moe_capacity_factor = 1.0f;
  float moe_eval_capacity_factor = 1.0f;
  int64_t moe_min_capacity = 4;
  // The model family (ds/models/family.h): the Hugging Face model_type an export writes ("gpt2",
  // "llama", "mistral", "qwen2", "qwen3", "glm", "glm4", "phi3"); "" = from the layout and features
  // (gpt2; qk_norm -> qwen3, qkv_bias -> qwen2, else llama).
  std::string family;

  // The defaults of a layout (gpt2 = GPT-2 124M; llama = the same shape with LLaMA's choices).
  static GPTConfig defaults(nn::Layout layout);
  // "tiny", "gpt2"/"gpt2-124m", "gpt2-350m"/"gpt2-medium", "gpt2-774m"/"gpt2-large",
  // "gpt2-1.5b"/"gpt2-xl", "llama-tiny", "test-gpt2", "test-llama". Throws listing the names.
  static GPTConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();

  // JSON with the field names above; "layout" is "gpt2" or "llama". Fields not given take the
  // layout's defaults, or those of "preset" when the object names one ({"preset": "tiny",
  // "dropout": 0.1}). Unknown keys are errors (a typo must not silently train another model).
  static GPTConfig from_json(const nlohmann::json& j);
  static GPTConfig from_json_string(const std::string& text);
  static GPTConfig load(const std::string& path);  // a model JSON file
  nlohmann::json to_json() const;
  std::string to_json_string() const;

  // Throws "[model] ..." naming the first bad field.
  void validate() const;
  int64_t head_dim() const { return head_size > 0 ? head_size : n_embd / n_head; }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  // Dims of each head that rotate: head_dim() * partial_rotary_factor (transformers' int()).
  int64_t rotary_dim() const;
  // family, or the one derived from the layout and features when it is empty.
  std::string resolved_family() const;
  int64_t resolved_ffn_hidden() const;
  int64_t resolved_moe_ffn_hidden() const {
    return moe_ffn_hidden > 0 ? moe_ffn_hidden : resolved_ffn_hidden();
  }
  nn::BlockConfig block_config() const;
  // Layer `layer`'s block: block_config() with its sliding window and rotary base (layer_types).
  nn::BlockConfig block_config(int64_t layer) const;
  bool layer_slides(int64_t layer) const;  // layer_types[layer] == "sliding_attention"
  // Parameter count from the shapes alone (no model built); tied weights counted once.
  int64_t num_parameters() const;
};

// Refuses, before anything is allocated, a config whose weights alone (num_parameters() elements
// of `dtype`) need more than `available` bytes (0: unknown, no check), naming `source` (the
// config file) and its sizes; num_parameters() itself refuses counts past 64 bits. For every tool
// about to build a model from a user's config (ds_generate, ds_serve, ds_train).
void check_model_fits(const GPTConfig& c, DType dtype, int64_t available,
                      const std::string& source);

// A pipeline stage's share of the model: layers [begin, end) of the layer sequence
//   0               embedding (wte and wpe / embed_tokens)
//   1 .. n_layer    the blocks (block i is layer i + 1)
//   n_layer + 1     final norm and LM head
// GPT::pipe_layers() lists them with their parameter counts for runtime::partition_layers.
struct PipeRange {
  int64_t begin = 0;
  int64_t end = -1;  // -1: through the last layer
};

// One entry of GPT::pipe_layers(): the layer's type (matched by partition_method "type:<regex>")
// and its trainable parameters (a tied head counts the embedding it multiplies by, as DeepSpeed's
// TiedLayerSpec does).
struct PipeLayerInfo {
  std::string type_name;  // "GPTEmbedding", "TransformerBlock", "GPTHead"
  int64_t num_parameters = 0;
};

// How one parameter is initialised.
struct ParamInit {
  enum Kind { normal, zeros, ones } kind = normal;
  float std = 0.02f;
};

class GPT : public nn::Module, public nn::PipelineStage {
 public:
  // Validates, builds and (unless init is false) initialises from config.seed. init = false leaves
  // parameters zero (norm weights one): for a model whose weights are loaded next, or whose shards
  // are initialised with init_values().
  explicit GPT(GPTConfig config, bool init = true);
  // Tensor parallel over tp's group (nn/tensor_parallel.h): every rank of the group builds this
  // with the same config and holds its part of each cut parameter (same names, local shapes;
  // tp_splits() says which part). Initialisation gives each part exactly the full model's values,
  // so tp = 1 and tp = N are the same model. forward() then returns this rank's vocabulary range
  // of the logits (B, T, V_local) and loss() is the full model's loss. generate() and ZeRO-3's
  // piecewise construction are not available with tp > 1.
  GPT(GPTConfig config, std::shared_ptr<nn::TensorParallel> tp, bool init = true);
  // One pipeline stage (runtime/pipeline_engine.h): only the layers of `layers` (PipeRange), with
  // the whole model's parameter names and initial values, tensor parallel over tp (may be null).
  // forward() takes token ids when the stage holds the embedding and the previous stage's hidden
  // states (B, T, C) otherwise; it returns logits when the stage holds the head and hidden states
  // otherwise. loss() needs the head. A tied head on a stage without the embedding multiplies by
  // tied_head_weight(), a copy of wte that is not a parameter: the pipeline engine sends its
  // gradient to the first stage and the first stage's updated wte back (DeepSpeed's
  // ReduceTiedGrads, with the optimizer state kept once).
  GPT(GPTConfig config, std::shared_ptr<nn::TensorParallel> tp, PipeRange layers, bool init = true);
  const std::shared_ptr<nn::TensorParallel>& tensor_parallel() const { return tp_; }

  // ---- pipeline stages ----
  static std::vector<PipeLayerInfo> pipe_layers(const GPTConfig& config);
  const PipeRange& pipe_range() const { return range_; }  // end resolved
  bool has_embedding() const { return range_.begin == 0; }
  bool has_head() const { return range_.end == config_.n_layer + 2; }
  bool is_whole() const { return has_embedding() && has_head(); }
  // nn::PipelineStage
  bool is_first_stage() const override { return has_embedding(); }
  bool is_last_stage() const override { return has_head(); }
  int64_t hidden_size() const override { return config_.n_embd; }
  // Runs of k consecutive blocks of this stage are checkpointed as one segment (k = 1: each block,
  // as set_gradient_checkpointing(true)); 0 turns it off.
  void set_activation_checkpoint_interval(int k) override;
  // Last stage with a tied head and no embedding: the copy of wte (V or V_local, C) it multiplies
  // by; it records gradients (.grad) but is no parameter. Undefined otherwise.
  Tensor tied_head_weight() const override { return tied_head_; }
  // First stage of a tied model whose head is elsewhere: wte's weight. Undefined otherwise.
  Tensor tied_embedding_weight() const override;

  const GPTConfig& config() const { return config_; }

  // ids (B, T) int32/int64, T <= block_size -> logits (B, T, V). Runs the module hooks.
  Tensor forward(const Tensor& ids) override;
  void to(Device device) override;  // also the position ids and a pipeline stage's tied head
  Tensor logits(const Tensor& ids) { return (*this)(ids); }
  // Mean cross entropy over targets != -100; ids and targets (B, T). Without tensor parallelism
  // the head computes it a block of rows at a time (ops::linear_cross_entropy: the (B*T, V) logits
  // never exist whole); with it, the logits (B*T, V_local) go to the vocab-parallel cross entropy.
  Tensor loss(const Tensor& ids, const Tensor& targets) override;
  using nn::Module::loss;  // loss(const nn::Batch&): input_ids and labels

  // Checkpoint every Block (recomputed in backward). Hides Module::set_gradient_checkpointing,
  // which would checkpoint the whole model as one segment and save nothing.
  void set_gradient_checkpointing(bool on);
  const std::vector<std::shared_ptr<nn::Block>>& blocks() const { return blocks_; }

  // Training FLOPs per token at sequence length seq_len (0 = block_size):
  //   6 * N                  forward + backward of every weight matmul (N = num_parameters(); the
  //                          tied wte counts once, for the LM head; wpe's lookup is counted though
  //                          free, a < 1% overestimate; with experts, only experts_per_tok of
  //                          each layer's experts count)
  // + 12 * L * C * seq_len   attention scores and weighted sum (QK^T and AV: 2 matmuls x 2 FLOPs
  //                          x 3 for backward), over the full T x T as in PaLM / nanoGPT; a causal
  //                          kernel does about half of it. C here is NH * hd (n_embd unless
  //                          head_size is set).
  double flops_per_token(int64_t seq_len = 0) const;

  // Autoregressive sampling under no_grad, no KV cache (every step reruns the cropped context).
  // prompt (B, T0) int -> (B, T0 + max_new_tokens) int64. top_k 1 = greedy; top_k 0 = the whole
  // distribution; otherwise the k most likely tokens. Draws come from (seed, step, row), so a
  // given seed gives the same text on any number of processes. Eval mode is used and restored.
  Tensor generate(const Tensor& prompt, int64_t max_new_tokens, int64_t top_k = 1,
                  uint64_t seed = 0, float temperature = 1.0f);

  // ---- incremental decoding (models::GPTDecoder, nn/decode.h; blocks() above) ----
  // ids (1, N) int on the model's device -> the token embedding (1, N, C), plus the learned
  // position embedding of `positions` (N values) where the family has one. Needs the embedding.
  Tensor decode_embed(const Tensor& ids, std::span<const int64_t> positions) const;
  Tensor decode_final_norm(const Tensor& x) const;  // (1, N, C) -> (1, N, C). Needs the head.
  // x (1, R, C) -> logits (1, R, V); rows as nn::Linear::decode. Needs the head (untied or tied
  // to this model's embedding).
  Tensor decode_head(const Tensor& x, bool rows) const;

  // ---- initialisation ----
  // One entry per named_parameters() entry: GPT-2: Linear and Embedding weights N(0, 0.02),
  // attn.c_proj and mlp.c_proj weights N(0, 0.02 / sqrt(2 L)), biases 0, norm weights 1; llama:
  // N(0, 0.02) for every matrix, norms 1.
  std::vector<ParamInit> init_plan() const;
  // Element `index` of parameter number `param_index` is rng::normal(seed, param_index, index)
  // scaled by std (or the constant): a pure function, so a rank holding only a shard initialises
  // exactly the values the full model would have. Fills out[0 .. n) with elements begin .. begin+n.
  static void init_values(const ParamInit& init, uint64_t seed, uint64_t param_index, int64_t begin,
                          int64_t n, float* out);
  void init_weights();  // (re)initialise every parameter from config().seed
  // init_values() of init_plan()[index] with config().seed (nn::Module's hook for ZeRO-3 shards).
  bool init_parameter_range(size_t index, int64_t begin, int64_t count, float* out) const override;

 private:
  GPTConfig config_;
  std::shared_ptr<nn::Embedding> tok_emb_, pos_emb_;  // wte / embed_tokens; wpe (gpt2 only)
  std::vector<std::shared_ptr<nn::Block>> blocks_;
  std::shared_ptr<nn::Module> norm_f_;   // ln_f / norm
  std::shared_ptr<nn::Linear> lm_head_;  // shares wte's weight when tied
  Tensor positions_;                     // (block_size) int64: 0 .. block_size-1, sliced for wpe
  mutable std::vector<ParamInit> init_plan_cache_;  // init_plan(), for init_parameter_range()
  std::shared_ptr<nn::TensorParallel> tp_;          // null: the whole model on this rank
  PipeRange range_;                                 // the layers held here (end resolved)
  int checkpoint_interval_ = 0;                     // set_activation_checkpoint_interval()
  Tensor tied_head_;                                // see tied_head_weight()
  // Set by loss() for the one forward it runs: the head then computes the loss against these
  // (N) targets without forming the logits (nn::Linear::cross_entropy) and forward returns it.
  Tensor loss_targets_;
  nn::TPSplit vocab_split_;  // the head's vocabulary range with tp (rows of wte/lm_head)
  // named_parameters()[i] is parameter param_index_[i] of the whole model (initialisation draws).
  std::vector<uint64_t> param_index_;
  int64_t full_index(size_t local) const;
  Tensor scale_embedding(const Tensor& x) const;  // (.., C): * sqrt(C) with embed_scale
  Tensor cap_logits(const Tensor& logits) const;  // (.., V): final_logit_softcapping
  Tensor head_logits(const Tensor& x);            // (B, T, C) -> (B, T, V), uncapped
  // The MoE layers' router probabilities of the running loss() (output_router_logits); null
  // without experts.
  std::shared_ptr<nn::RouterLog> router_log_;
  // loss()'s forward of ids (loss_targets_ set) plus coef * the routers' load-balancing loss.
  Tensor add_router_loss(const Tensor& ids);
};

}  // namespace ds::models
