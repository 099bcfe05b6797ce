#pragma once
// Encoder-decoder (sequence-to-sequence) language models: transformers'
// BartForConditionalGeneration, BlenderbotForConditionalGeneration and T5ForConditionalGeneration,
// configured by Seq2SeqConfig and computing what they compute (eval mode exactly; in training,
// dropout at the same places). BART / BlenderBot first, T5 below.
//
//   embed     e = shared[ids] * embed_scale + positions[t + position_offset]          (B, S|T, C)
//             embed_scale = sqrt(C) when scale_embedding, else 1; t = 0.. (no padding offset)
//             BART: LayerNorm(e) (layernorm_embedding); BlenderBot: e as is
//   encoder   L_enc layers of self-attention over the source keys attention_mask marks and an FFN
//             fc2(act(fc1(x))); post-LN (BART): x = LN(x + sublayer(x)); pre-LN (BlenderBot,
//             pre_norm): x = x + sublayer(LN(x)), and a final layer_norm after the last layer
//   decoder   L_dec layers: causal self-attention, cross-attention over the encoder output
//             (source padding masked), FFN; the same LN placement, and (pre_norm) a final
//             layer_norm
//   head      logits = decoder_out @ shared^T + final_logits_bias                      (B, T, V)
//             (lm_head is tied to model.shared; final_logits_bias (1, V) is a buffer: loaded,
//             exported, never trained)
//   loss      mean cross entropy over labels != -100; the decoder input is
//             shift_tokens_right(labels, pad_token_id, decoder_start_token_id) unless given;
//             the head and the loss fused (nn::Linear::cross_entropy: no (B, T, V) logits)
//
// Parameter names are transformers' (model.shared.weight, model.encoder.embed_positions.weight,
// model.encoder.layers.{i}.self_attn.{q,k,v,out}_proj.{weight,bias},
// model.encoder.layers.{i}.{self_attn_layer_norm,fc1,fc2,final_layer_norm}.*,
// model.decoder.layers.{i}.encoder_attn.*, ...encoder_attn_layer_norm.*,
// model.{encoder,decoder}.layernorm_embedding.* (BART), model.{encoder,decoder}.layer_norm.*
// (BlenderBot)); the buffer is final_logits_bias. Hugging Face import and export:
// ds/models/seq2seq_io.h.
//
// T5 (family "t5", src/models/seq2seq_t5.cpp; the same generation code, KV cache and logits
// processors):
//   embed     e = shared[ids], dropout; no position embeddings, no scaling
//   layers    pre-norm, T5LayerNorm = RMS norm without bias or mean (weight only, norm_eps):
//             x = x + dropout(sublayer(norm(x))); encoder: self-attention, FFN; decoder:
//             causal self-attention, cross-attention, FFN; a final_layer_norm (then dropout) per
//             stack
//   attention q/k/v/o without bias, inner dim NH * d_kv (d_kv independent of d_model),
//             scores q k^T WITHOUT 1/sqrt(d_kv), plus the relative position bias
//             table[bucket(j - i)] (relative_buckets, relative_max_distance; bidirectional buckets
//             in the encoder, unidirectional in the decoder): only block 0 of each stack has the
//             table (NB, NH), later blocks add the same bias; cross-attention has none
//   FFN       wo(act(wi(x))) ("relu": T5DenseActDense) or wo(act(wi_0(x)) * wi_1(x)) (gated_ffn:
//             T5DenseGatedActDense, "gated-gelu" = gelu_new), dropout after the activation
//   head      tie_word_embeddings: logits = (h * d_model^-0.5 when scale_decoder_outputs) @
//             shared^T; untied (t5-v1_1, flan-t5): lm_head.weight (V, C) of its own; no
//             final_logits_bias. transformers 5 decides the scale by scale_decoder_outputs
//             (config.json's tie_word_embeddings when absent) and unties lm_head when the file's
//             lm_head.weight differs from shared.weight; ds/models/seq2seq_io.h reads both so.
//   names     shared.weight, {encoder,decoder}.block.{i}.layer.0.SelfAttention.{q,k,v,o}.weight,
//             {..}.block.0.layer.0.SelfAttention.relative_attention_bias.weight,
//             {..}.layer.{0,1|2}.layer_norm.weight, decoder.block.{i}.layer.1.EncDecAttention.*,
//             {..}.layer.{1|2}.DenseReluDense.{wi,wi_0,wi_1,wo}.weight,
//             {encoder,decoder}.final_layer_norm.weight, lm_head.weight (untied only)
//   the pad row of shared trains like any other (T5's nn.Embedding has no padding_idx);
//   decoder_start_token_id is pad (0), eos 1; sequence lengths are unbounded (max_positions is
//   not used).
//
// Like torch's nn.Embedding(padding_idx), the row of model.shared at pad_token_id gets no gradient
// from the embedding lookups (the tied lm_head still trains it, as in transformers).
//
// Padding: the source must be right-padded (each attention_mask row 1...1 0...0, at least one 1);
// the decoder self-attention is causal only (transformers' default decoder_attention_mask None):
// positions after a row's end compute garbage that labels of -100 ignore.
//
// Thread safety: a model is used by one thread at a time (forward stores the batch's masks and the
// encoder output where the layers read them). With gradient checkpointing, run backward before
// the next forward (the recomputation reads the latest forward's masks).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "ds/nn/layers.h"
#include "ds/nn/module.h"
#include "ds/ops/ops.h"

namespace ds::models {

struct Seq2SeqConfig {
  // "bart", "blenderbot" or "t5": the family's architecture flags below are set by the Hugging
  // Face reader (ds/models/seq2seq_io.h) and checked against the family by validate().
  std::string family = "bart";
  int64_t vocab_size = 50265;    // V
  int64_t max_positions = 1024;  // max_position_embeddings: longest source / target
  int64_t d_model = 1024;        // C
  int64_t encoder_layers = 12;
  int64_t decoder_layers = 12;
  int64_t encoder_heads = 16;
  int64_t decoder_heads = 16;
  int64_t encoder_ffn = 4096;
  int64_t decoder_ffn = 4096;
  // "gelu" (exact, erf), "gelu_new" / "gelu_pytorch_tanh" (tanh approximation), "relu", "silu".
  std::string activation = "gelu";
  float dropout = 0.1f;             // embeddings, attention output, FFN output (training)
  float attention_dropout = 0.0f;   // attention probabilities (training; forms them)
  float activation_dropout = 0.0f;  // after the activation (training)
  bool scale_embedding = false;     // token embeddings times sqrt(d_model)
  // Architecture: BART: post-LN, layernorm_embedding, no final norms, positions offset by 2;
  // BlenderBot: pre-LN, final layer_norm in encoder and decoder, no layernorm_embedding, offset 0.
  bool pre_norm = false;
  bool embedding_norm = true;
  bool final_norm = false;
  int64_t position_offset = 2;  // rows of embed_positions = max_positions + position_offset
  float norm_eps = 1e-5f;       // every LayerNorm (torch's default: the classes fix it)
  int64_t pad_token_id = 1;
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 2;
  int64_t decoder_start_token_id = 2;
  int64_t forced_eos_token_id = 2;  // generation: the token forced at max length; -1 = none
  // std of the normal initialisation; T5: initializer_factor (each module's std is a factor of
  // it, as T5PreTrainedModel._init_weights)
  float init_std = 0.02f;
  uint64_t seed = 0;  // parameter initialisation
  // T5 only (the BART families need the defaults). d_kv = head size (T5 needs it > 0);
  // encoder_heads = decoder_heads, encoder_ffn = decoder_ffn (T5Config's num_heads, d_ff).
  int64_t d_kv = 0;
  int64_t relative_buckets = 32;        // relative_attention_num_buckets
  int64_t relative_max_distance = 128;  // relative_attention_max_distance
  bool gated_ffn = false;               // feed_forward_proj "gated-<act>"
  bool tie_word_embeddings = true;      // lm_head is shared.weight; false: a parameter of its own
  bool scale_decoder_outputs = true;    // decoder output * d_model^-0.5 before lm_head

  // The family's defaults for the architecture flags (bart / blenderbot / t5).
  void set_family_architecture();
  bool is_t5() const { return family == "t5"; }
  // Throws "[model] ..." naming the first bad field (an architecture flag that differs from the
  // family's is an error: no checkpoint of that family computes it).
  void validate() const;
  int64_t num_parameters() const;
  // Our own JSON form (the fields above by name); unknown keys are errors.
  nlohmann::json to_json() const;
  static Seq2SeqConfig from_json(const nlohmann::json& j);
};

// One batch. input_ids / attention_mask (B, S) int; attention_mask undefined = no padding.
// labels (B, T) int, -100 = ignored. decoder_input_ids (B, T) int; undefined =
// shift_tokens_right(labels).
struct Seq2SeqInputs {
  Tensor input_ids;
  Tensor attention_mask;
  Tensor decoder_input_ids;
  Tensor labels;
};

// transformers' shift_tokens_right: out[:, 0] = start, out[:, 1:] = labels[:, :-1], -100 -> pad.
// labels (B, T) int -> (B, T) i64 on the host.
Tensor shift_tokens_right(const Tensor& labels, int64_t pad_token_id,
                          int64_t decoder_start_token_id);

// Greedy decoding options (transformers' generate(num_beams=1, do_sample=False)).
struct GreedyOptions {
  int64_t max_new_tokens = 20;
  // -2 = the config's value; -1 = none. eos ends a row (later tokens are pad); forced_eos is the
  // only token allowed at the last step (transformers' ForcedEOSTokenLogitsProcessor).
  int64_t eos_token_id = -2;
  int64_t forced_eos_token_id = -2;
  // The only token allowed at the first step (transformers' ForcedBOSTokenLogitsProcessor);
  // -1 = none.
  int64_t forced_bos_token_id = -1;
  // transformers' logits processors (as BeamOptions): eos banned below min_length (the decoder
  // start counts), no repeated n-grams of the output / of the source row; 0 = off.
  int64_t min_length = 0;
  int64_t no_repeat_ngram_size = 0;
  int64_t encoder_no_repeat_ngram_size = 0;
  // Keep each decoder layer's keys and values (self-attention's growing, cross-attention's
  // projected once) and run one position per step; false recomputes the whole prefix each step
  // (the same tokens: a check of the cache).
  bool use_cache = true;
};

// Beam search options (transformers' generate(num_beams > 1, do_sample=False) with its logits
// processors). Lengths count the decoder start token, as transformers' max_length / min_length.
struct BeamOptions {
  int64_t num_beams = 4;
  int64_t max_new_tokens = 20;
  int64_t min_length = 0;       // eos is banned while the sequence is shorter
  float length_penalty = 1.0f;  // finished score = sum log p / (generated tokens)^length_penalty
  int64_t no_repeat_ngram_size = 0;          // 0 = off
  int64_t encoder_no_repeat_ngram_size = 0;  // n-grams of the source row are not repeated
  // transformers' early_stopping: "false" (its heuristic), "true" (stop once num_beams
  // hypotheses finished), "never" (the canonical search).
  std::string early_stopping = "false";
  int64_t eos_token_id = -2;         // -2 = the config's; -1 = none
  int64_t forced_eos_token_id = -2;  // -2 = the config's; -1 = none
  int64_t forced_bos_token_id = -1;  // as GreedyOptions'; -1 = none
  bool use_cache = true;             // as GreedyOptions::use_cache

  // Throws "[seq2seq] <field> ..." naming the first bad value: num_beams, max_new_tokens < 1,
  // a negative min_length or n-gram size, a length_penalty that is not a finite number (nan or
  // inf would make every score nan: no hypothesis, an empty output), an early_stopping other
  // than false / true / never. ds_generate, ds_serve and generate() call it.
  void validate() const;
};

class Seq2Seq : public nn::Module {
 public:
  // Validates, builds and (unless init is false) initialises: Linear and Embedding weights
  // N(0, init_std) from config.seed, biases 0, LayerNorms 1 and 0, the pad row of model.shared 0
  // (transformers' _init_weights); final_logits_bias 0. T5: T5PreTrainedModel._init_weights with
  // init_std as initializer_factor (src/models/seq2seq_t5.cpp; norms at the factor). init = false
  // leaves the parameters zero (LayerNorm weights one), for weights loaded next. Under
  // nn::PartitionedInit nothing is initialised here: ZeRO-3 draws each shard from
  // init_parameter_range, the same values.
  explicit Seq2Seq(Seq2SeqConfig config, bool init = true);
  const Seq2SeqConfig& config() const { return config_; }

  // The encoder's last hidden states (B, S, C) (after the final layer_norm when pre_norm).
  Tensor encode(const Tensor& input_ids, const Tensor& attention_mask = {});
  // Decoder logits (B, T, V) for decoder_input_ids (B, T) over `memory` (B, S, C) from encode()
  // with the same attention_mask.
  Tensor decode(const Tensor& decoder_input_ids, const Tensor& memory,
                const Tensor& attention_mask = {});
  // encode + decode -> logits (B, T, V).
  Tensor logits(const Seq2SeqInputs& in);
  // Mean cross entropy of logits(in) against in.labels (ignore_index -100) -> scalar.
  Tensor loss(const Seq2SeqInputs& in);

  // Greedy generation: the encoder runs once, the decoder one position per step with a KV cache
  // (GreedyOptions::use_cache). input_ids and attention_mask may be in host memory or on the
  // model's device (as generate_beam's). -> (B, 1 + n) i64 on the host: decoder_start_token_id,
  // then the tokens; stops early when every row has ended (n < max_new_tokens), as transformers.
  Tensor generate_greedy(const Tensor& input_ids, const Tensor& attention_mask,
                         const GreedyOptions& opt = {});
  // Beam search (src/models/seq2seq_beam.cpp), transformers' algorithm step for step: the
  // 2 * num_beams best continuations of all beams, finished ones (eos or max length) scored with
  // the length penalty into a num_beams-best list, the others continuing. -> (B, 1 + n) i64 on the
  // host: each row's best hypothesis; rows shorter than the longest are filled with pad_token_id
  // (eos when pad_token_id is 0, as transformers).
  Tensor generate_beam(const Tensor& input_ids, const Tensor& attention_mask,
                       const BeamOptions& opt = {});

  // Greedy decoding (num_beams 1, BeamOptions' processors and cache switch carried over) or
  // beam search: transformers' generate(do_sample=False) with these settings
  // (read_hf_generation_options reads a checkpoint's).
  Tensor generate(const Tensor& input_ids, const Tensor& attention_mask, const BeamOptions& opt);

  // nn::Module's one-tensor forms: source ids (B, S) without padding -> logits of the decoder
  // input shift_tokens_right(ids) (forward); loss(ids, labels): labels (B, T) with -100 ignored.
  Tensor forward(const Tensor& ids) override;
  Tensor loss(const Tensor& ids, const Tensor& labels) override;
  // The engine's form (ds/nn/batch.h): input_ids and attention_mask of the source, labels,
  // decoder_input_ids optional.
  Tensor loss(const nn::Batch& batch) override;

  // (1, V), buffer; undefined for T5 (no such buffer)
  const Tensor& final_logits_bias() const { return final_logits_bias_; }

  // Checkpoint every encoder and decoder layer (recomputed in backward; the same gradients).
  // Hides Module::set_gradient_checkpointing, as GPT's does. T5: each checkpointed block looks
  // the relative position bias up from block 0's table inside its recomputation. A
  // decoder layer then takes its input and the encoder output as one tensor, so the recomputation
  // sees both.
  void set_gradient_checkpointing(bool on);

  void init_weights();
  // Elements [begin, begin + count) of parameter `index`'s initial values: a pure function of
  // (seed, index, element), as GPT::init_values.
  bool init_parameter_range(size_t index, int64_t begin, int64_t count, float* out) const override;

 private:
  class Attention;
  class Layer;
  class Stack;
  class T5Stack;                // src/models/seq2seq_t5.cpp
  friend class Seq2SeqDecoder;  // ds/models/seq2seq_decoder.h: serving runs decode_step
  // One decoder layer's keys and values during generation. Self-attention's (B, NH, P, hd) are
  // allocated ahead for P positions (detail::self_cache_capacity: doubled when full, at least 64,
  // at most the group's max_positions) and written in place, one position a step; positions at
  // and past the group's are not read (zero, or stale after Seq2SeqDecoder::truncate), so memory
  // is bounded by P, not by the steps taken. Cross-attention's are the encoder output's
  // (B, NH, S, hd), projected once.
  struct LayerCache {
    Tensor self_k, self_v, cross_k, cross_v;
  };
  // Rows of one decode step that share their caches: a batch of sequences at one position
  // (generate_greedy, beam search: one group of B rows) or one sequence (Seq2SeqDecoder: a group
  // each, at its own position, over its own source).
  struct StepGroup {
    std::vector<LayerCache>* caches = nullptr;  // one per decoder layer (made on the first step)
    int64_t rows = 1;                           // the step's next `rows` rows are this group's
    int64_t pos = 0;                            // their decoder position
    Tensor
        memory;  // (rows, S, C) encoder output: projected into the cross caches on the first step
    std::vector<int64_t> cross_lengths;  // memory's source length per row; {} = all S
    int64_t max_positions = 0;           // the self-attention caches' limit (>= pos + 1)
  };
  Seq2SeqConfig config_;
  std::shared_ptr<nn::Embedding> shared_;
  std::shared_ptr<Stack> encoder_, decoder_;          // BART / BlenderBot
  std::shared_ptr<T5Stack> t5_encoder_, t5_decoder_;  // T5
  std::shared_ptr<nn::Linear> lm_head_;  // tied to shared_ (unless T5 with tie_word_embeddings off)
  Tensor final_logits_bias_;
  mutable std::vector<std::string> param_names_;

  // The decoder's last hidden states (B, T, C) (decode without the head).
  Tensor decoder_hidden(const Tensor& decoder_input_ids, const Tensor& memory,
                        const Tensor& attention_mask);
  // What the LM head multiplies: h, or h * d_model^-0.5 (T5's scale_decoder_outputs).
  Tensor head_input(const Tensor& h) const;
  // Logits (B, T, V) of the decoder's last hidden states (B, T, C): the head of the family.
  // row_kernel: see decode_step.
  Tensor head(const Tensor& h, bool row_kernel = false);
  void build_t5();  // the T5 module tree (seq2seq_t5.cpp)
  // T5Stack::run of the encoder (decoder false) or the decoder, and T5Stack::step of the decoder.
  Tensor t5_run(bool decoder, const Tensor& tokens, std::vector<int64_t> self_lengths,
                Tensor memory, std::vector<int64_t> cross_lengths);
  Tensor t5_step(const Tensor& tokens, std::span<const StepGroup> groups, bool row_kernel);
  void t5_checkpoint(bool on);
  bool init_t5_range(const std::string& name, size_t index, int64_t begin, int64_t count,
                     float* out) const;

  // Logits (B, 1, V) of the decoder input ids (B, 1) at position pos, the earlier positions'
  // keys and values in caches (one per decoder layer; filled on the first step), which hold at
  // most max_positions target positions.
  Tensor decode_step(const Tensor& ids, int64_t pos, const Tensor& memory,
                     const Tensor& attention_mask, std::vector<LayerCache>& caches,
                     int64_t max_positions);
  // The one cached decoder step every generation runs: logits (N, 1, V) of ids (N, 1), the rows
  // split into groups in order (their rows sum to N); each group attends to its own caches (its
  // rows' keys and values appended) and source. The projections and the FFN run once over all N
  // rows; attention runs per group. row_kernel: the projections per row (ops::linear_rows, fp32
  // weights without LoRA), so that a row's logits do not depend on the other rows (continuous
  // batching); false: GEMMs. Eval mode and no gradient are the caller's.
  Tensor decode_step(const Tensor& ids, std::span<const StepGroup> groups, bool row_kernel);
};

}  // namespace ds::models
