// GPT-2: GPT2LMHeadModel (and GPT2Model files, without the "transformer." prefix).
//
//   [transformer.]wte.weight, wpe.weight, h.{i}.ln_1.{weight,bias}, h.{i}.attn.c_attn.{weight,bias},
//   h.{i}.attn.c_proj.*, h.{i}.ln_2.*, h.{i}.mlp.c_fc.*, h.{i}.mlp.c_proj.*, ln_f.*; the LM head is
//   tied to wte. c_attn, c_proj and c_fc are Conv1D modules: weights stored (in, out), transposed
//   both ways. Old files carry the causal mask as h.{i}.attn.bias / masked_bias buffers.
#include <regex>

#include "ds/core/error.h"
#include "ds/models/family.h"
#include "hf_config.h"

namespace ds::models {

namespace {

using nlohmann::json;

GPTConfig read(const json& j, const std::string&, const std::string& source) {
  // GPT2Config's fields; summary_* configure GPT2DoubleHeadsModel's classifier, and
  // reorder_and_upcast_attn only the precision of the scores; attention-probability dropout
  // (attn_pdrop) is training-only and not implemented (see docs/models.md).
  static const std::set<std::string> fields = {"vocab_size",
                                               "n_positions",
                                               "n_ctx",
                                               "n_embd",
                                               "n_layer",
                                               "n_head",
                                               "n_inner",
                                               "layer_norm_epsilon",
                                               "resid_pdrop",
                                               "embd_pdrop",
                                               "attn_pdrop",
                                               "tie_word_embeddings",
                                               "activation_function",
                                               "scale_attn_weights",
                                               "scale_attn_by_inverse_layer_idx",
                                               "reorder_and_upcast_attn",
                                               "summary_type",
                                               "summary_use_proj",
                                               "summary_activation",
                                               "summary_proj_to_labels",
                                               "summary_first_dropout",
                                               "n_special"};
  hf::check_known_fields(j, fields, "gpt2", source);
  GPTConfig c = GPTConfig::defaults(nn::Layout::gpt2);
  c.vocab_size = hf::get_field<int64_t>(j, "vocab_size", 50257, source);
  c.block_size = hf::get_field<int64_t>(j, "n_positions",
                                        hf::get_field<int64_t>(j, "n_ctx", 1024, source), source);
  c.n_embd = hf::get_field<int64_t>(j, "n_embd", 768, source);
  c.n_layer = hf::get_field<int64_t>(j, "n_layer", 12, source);
  c.n_head = hf::get_field<int64_t>(j, "n_head", 12, source);
  c.ffn_hidden = hf::get_field<int64_t>(j, "n_inner", 0, source);
  c.norm_eps = hf::get_field<float>(j, "layer_norm_epsilon", 1e-5f, source);
  // Our dropout sits where GPT-2's resid_pdrop does (and on the embeddings); attention-prob
  // dropout does not exist in the fused attention kernel.
  c.dropout = hf::get_field<float>(j, "resid_pdrop", 0.1f, source);
  c.tie_embeddings = hf::get_field<bool>(j, "tie_word_embeddings", true, source);
  const auto act = hf::get_field<std::string>(j, "activation_function", "gelu_new", source);
  DS_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh",
           "[hf_io] {}: activation_function \"{}\" is not supported; the gpt2 layout uses the "
           "tanh GELU (\"gelu_new\")",
           source, act);
  DS_CHECK(hf::get_field<bool>(j, "scale_attn_weights", true, source),
           "[hf_io] {}: scale_attn_weights false is not supported", source);
  DS_CHECK(!hf::get_field<bool>(j, "scale_attn_by_inverse_layer_idx", false, source),
           "[hf_io] {}: scale_attn_by_inverse_layer_idx is not supported", source);
  return c;
}

json write(const GPTConfig& c) {
  return {{"vocab_size", c.vocab_size},
          {"n_positions", c.block_size},
          {"n_ctx", c.block_size},
          {"n_embd", c.n_embd},
          {"n_layer", c.n_layer},
          {"n_head", c.n_head},
          {"n_inner", c.ffn_hidden > 0 ? json(c.ffn_hidden) : json(nullptr)},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", hf::shortest(c.norm_eps)},
          {"resid_pdrop", hf::shortest(c.dropout)},
          {"embd_pdrop", hf::shortest(c.dropout)},
          {"attn_pdrop", 0.0},
          {"scale_attn_weights", true},
          {"tie_word_embeddings", c.tie_embeddings}};
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

HFPlace place(const GPTConfig&, const std::string& ours) {
  if (ours == "lm_head.weight") return {ours};
  HFPlace p{"transformer." + ours};
  if (ends_with(ours, ".weight"))
    for (const char* m : {".attn.c_attn.", ".attn.c_proj.", ".mlp.c_fc.", ".mlp.c_proj."})
      if (ours.find(m) != std::string::npos) p.transposed = true;
  return p;
}

bool is_buffer(const std::string& name) {
  static const std::regex mask(R"((transformer\.)?h\.\d+\.attn\.(masked_)?bias)");
  return std::regex_match(name, mask);
}

void check(const GPTConfig& c) {
  DS_CHECK(c.layout == nn::Layout::gpt2, "[model] family \"gpt2\" needs the gpt2 layout");
}

Family make() {
  Family f;
  f.name = "gpt2";
  f.model_types = {"gpt2"};
  f.architecture = "GPT2LMHeadModel";
  f.decoder.layout = nn::Layout::gpt2;
  f.lora_targets = {"c_attn"};
  f.prefix = "transformer.";
  f.decoder.read_config = read;
  f.decoder.write_config = write;
  f.decoder.place = place;
  f.is_buffer = is_buffer;
  f.decoder.check = check;
  return f;
}

}  // namespace

namespace families {
const Family gpt2 = make();
}  // namespace families

}  // namespace ds::models
