// DeBERTa-v2 sequence classifier (ds/models/deberta.h): its config options, the module tree under
// transformers' names, and the forward pass.
#include "ds/models/deberta.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "ds/autograd/grad_mode.h"
#include "ds/core/error.h"
#include "ds/models/gpt.h"  // ParamInit / GPT::init_values: the same counter-based draws
#include "module_util.h"

namespace ds::models {

using detail::check_ids;
using detail::Container;
using detail::init_encoder_values;
using detail::zero_span;

using nlohmann::json;

// ---- config ----

namespace {

bool known_act(const std::string& a) {
  return a == "gelu" || a == "gelu_new" || a == "gelu_pytorch_tanh" || a == "tanh" || a == "silu" ||
         a == "swish";
}

// transformers' ACT2FN for the names known_act accepts.
Tensor activate(const std::string& act, const Tensor& x) {
  if (act == "gelu") return ops::gelu_erf(x);
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") return ops::gelu(x);
  if (act == "tanh") return ops::tanh(x);
  if (act == "silu" || act == "swish") return ops::silu(x);
  DS_THROW("[deberta] activation \"{}\" is not supported", act);
}

}  // namespace

int64_t DebertaOptions::att_span(int64_t max_positions) const {
  if (position_buckets > 0) return position_buckets;
  return max_relative_positions >= 1 ? max_relative_positions : max_positions;
}

void validate_deberta(const EncoderConfig& c) {
  const DebertaOptions& d = c.deberta;
  DS_CHECK(d.embedding_size >= 0, "[model] deberta embedding_size must be >= 0 (0: n_embd), got {}",
           d.embedding_size);
  DS_CHECK(known_act(c.hidden_act),
           "[model] deberta hidden_act \"{}\" is not supported (gelu, gelu_new, "
           "gelu_pytorch_tanh, tanh, silu)",
           c.hidden_act);
  DS_CHECK(known_act(d.pooler_hidden_act),
           "[model] deberta pooler_hidden_act \"{}\" is not supported (gelu, gelu_new, "
           "gelu_pytorch_tanh, tanh, silu)",
           d.pooler_hidden_act);
  DS_CHECK(d.pooler_dropout >= 0.0f && d.pooler_dropout < 1.0f,
           "[model] deberta pooler_dropout must be in [0, 1), got {}", d.pooler_dropout);
  if (d.relative_attention)
    DS_CHECK(d.att_span(c.max_positions) >= 1,
             "[model] deberta relative attention needs at least one relative position");
  if (d.conv_kernel_size > 0) {
    DS_CHECK(d.conv_kernel_size % 2 == 1,
             "[model] deberta conv_kernel_size {} must be odd (transformers' ConvLayer keeps the "
             "length only then)",
             d.conv_kernel_size);
    DS_CHECK(d.conv_groups >= 1 && c.n_embd % d.conv_groups == 0,
             "[model] deberta conv_groups {} must divide n_embd {}", d.conv_groups, c.n_embd);
    DS_CHECK(known_act(d.conv_act),
             "[model] deberta conv_act \"{}\" is not supported (gelu, gelu_new, "
             "gelu_pytorch_tanh, tanh, silu)",
             d.conv_act);
  }
}

int64_t deberta_num_parameters(const EncoderConfig& c) {
  const DebertaOptions& d = c.deberta;
  const int64_t C = c.n_embd, F = c.ffn_hidden, E = d.embedding_dim(C);
  int64_t n = c.vocab_size * E + 2 * C;
  if (d.position_biased_input) n += c.max_positions * E;
  n += c.type_vocab_size * E;
  if (E != C) n += E * C;
  int64_t layer = 4 * (C * C + C) + 2 * (2 * C) + (C * F + F) + (F * C + C);
  if (d.relative_attention && !d.share_att_key)
    layer += ((d.c2p ? 1 : 0) + (d.p2c ? 1 : 0)) * (C * C + C);
  n += c.n_layer * layer;
  if (d.relative_attention) n += 2 * d.att_span(c.max_positions) * C;
  if (d.norm_rel_ebd) n += 2 * C;
  if (d.conv_kernel_size > 0) n += C * (C / d.conv_groups) * d.conv_kernel_size + C + 2 * C;
  return n + (C * C + C) + (C * c.num_labels + c.num_labels);
}

json deberta_options_to_json(const DebertaOptions& d) {
  json pos = json::array();
  if (d.p2c) pos.push_back("p2c");
  if (d.c2p) pos.push_back("c2p");
  return {{"embedding_size", d.embedding_size},
          {"position_biased_input", d.position_biased_input},
          {"relative_attention", d.relative_attention},
          {"max_relative_positions", d.max_relative_positions},
          {"position_buckets", d.position_buckets},
          {"share_att_key", d.share_att_key},
          {"pos_att_type", pos},
          {"norm_rel_ebd", d.norm_rel_ebd},
          {"conv_kernel_size", d.conv_kernel_size},
          {"conv_act", d.conv_act},
          {"conv_groups", d.conv_groups},
          {"pooler_hidden_act", d.pooler_hidden_act},
          {"pooler_dropout", d.pooler_dropout}};
}

DebertaOptions deberta_options_from_json(const json& j) {
  DS_CHECK(j.is_object(), "[model] encoder config field \"deberta\" must be a JSON object");
  DebertaOptions d;
  const json known = deberta_options_to_json(d);
  for (const auto& [k, v] : j.items())
    DS_CHECK(known.contains(k), "[model] unknown deberta config field \"{}\"", k);
  auto get = [&](const char* key, auto& field) {
    if (!j.contains(key)) return;
    try {
      field = j[key].get<std::decay_t<decltype(field)>>();
    } catch (const json::exception&) {
      DS_THROW("[model] deberta config field \"{}\" has a bad value: {}", key, j[key].dump());
    }
  };
  get("embedding_size", d.embedding_size);
  get("position_biased_input", d.position_biased_input);
  get("relative_attention", d.relative_attention);
  get("max_relative_positions", d.max_relative_positions);
  get("position_buckets", d.position_buckets);
  get("share_att_key", d.share_att_key);
  get("norm_rel_ebd", d.norm_rel_ebd);
  get("conv_kernel_size", d.conv_kernel_size);
  get("conv_act", d.conv_act);
  get("conv_groups", d.conv_groups);
  get("pooler_hidden_act", d.pooler_hidden_act);
  get("pooler_dropout", d.pooler_dropout);
  std::vector<std::string> pos;
  get("pos_att_type", pos);
  for (const auto& p : pos) {
    DS_CHECK(p == "c2p" || p == "p2c", "[model] deberta pos_att_type \"{}\" is unknown (c2p, p2c)",
             p);
    (p == "c2p" ? d.c2p : d.p2c) = true;
  }
  return d;
}

int64_t deberta_log_bucket(int64_t rel, int64_t bucket_size, int64_t max_position) {
  if (bucket_size <= 0 || max_position <= 0) return rel;
  const int64_t mid = bucket_size / 2;
  const int64_t a = rel < 0 ? -rel : rel;
  if (a <= mid) return rel;
  // torch: abs / mid in float32, log in float32, the log of (max_position - 1) / mid (a double
  // made a float32 tensor), ceil(ratio * (mid - 1)) + mid.
  const float num = std::log(static_cast<float>(a) / static_cast<float>(mid));
  const float den = std::log(
      static_cast<float>(static_cast<double>(max_position - 1) / static_cast<double>(mid)));
  const float v = std::ceil(num / den * static_cast<float>(mid - 1)) + static_cast<float>(mid);
  const int64_t b = static_cast<int64_t>(v);
  return rel < 0 ? -b : b;
}

// ---- the module tree ----

namespace {

// out[..., q, k] = e[..., q, T-1-q+k] for e (..., T, 2T-1) whose column m holds distance
// q - k = T-1-m: row q of the result starts at flat offset q * (2T-1) + T-1-q of e, i.e. rows of
// stride 2T-2 from offset T-1.
Tensor skew(const Tensor& e) {
  const int64_t T = e.size(-2);
  if (T == 1) return e;
  Shape lead(e.shape().begin(), e.shape().end() - 2);
  Shape flat = lead, rows = lead;
  flat.push_back(T * (2 * T - 1));
  rows.push_back(T);
  rows.push_back(2 * T - 2);
  const int64_t last = static_cast<int64_t>(lead.size());
  Tensor f = ops::reshape(ops::contiguous(e), flat);
  Tensor s = ops::slice(f, last, T - 1, T - 1 + T * (2 * T - 2));
  return ops::slice(ops::reshape(ops::contiguous(s), rows), last + 1, 0, T);
}

}  // namespace

// nn.Conv1d(C, C, K, padding=(K-1)/2, groups=G) over time on (B, T, C), by K shifted matmuls.
class DebertaClassifier::Conv : public nn::Module {
 public:
  Conv(int64_t C, int64_t K, int64_t G) : Module("Conv1d"), C_(C), K_(K), G_(G) {
    weight_ = register_parameter("weight", Tensor::zeros({C, C / G, K}));
    bias_ = register_parameter("bias", Tensor::zeros({C}));
  }
  Tensor forward(const Tensor& x) override {  // (B, T, C) -> (B, T, C)
    const int64_t B = x.size(0), T = x.size(1), C = C_, G = G_, Cg = C / G, p = (K_ - 1) / 2;
    Tensor pad = Tensor::zeros({B, p, C}, x.dtype(), x.device());
    Tensor xp = p > 0 ? ops::concat({pad, x, pad}, 1) : x;  // (B, T + 2p, C)
    Tensor out;
    for (int64_t k = 0; k < K_; ++k) {
      Tensor xs = ops::slice(xp, 1, k, k + T);  // (B, T, C)
      Tensor wk = ops::reshape(ops::contiguous(ops::slice(weight_, 2, k, k + 1)), {C, Cg});
      Tensor y;
      if (G == 1) {
        y = ops::linear(xs, wk);
      } else {  // (B, G, T, Cg) @ (G, Cg_in, Cg_out) -> (B, T, C)
        Tensor xg = ops::transpose(ops::reshape(ops::contiguous(xs), {B, T, G, Cg}), 1, 2);
        Tensor wg = ops::transpose(ops::reshape(wk, {G, Cg, Cg}), 1, 2);
        y = ops::reshape(ops::contiguous(ops::transpose(ops::matmul(xg, wg), 1, 2)), {B, T, C});
      }
      out = out.defined() ? ops::add(out, y) : y;
    }
    return ops::add(out, bias_);
  }

 private:
  int64_t C_, K_, G_;
  Tensor weight_, bias_;
};

class DebertaClassifier::Layer : public nn::Module {
 public:
  Layer(const EncoderConfig& c, std::shared_ptr<Batch> batch)
      : Module("DebertaV2Layer"),
        n_head_(c.n_head),
        dropout_(c.hidden_dropout),
        attn_dropout_(c.attention_dropout),
        act_(c.hidden_act),
        d_(c.deberta),
        batch_(std::move(batch)) {
    const int64_t C = c.n_embd, F = c.ffn_hidden;
    auto attention =
        register_module("attention", std::make_shared<Container>("DebertaV2Attention"));
    auto self = attention->add("self", std::make_shared<Container>("DisentangledSelfAttention"));
    query_ = self->add("query_proj", std::make_shared<nn::Linear>(C, C));
    key_ = self->add("key_proj", std::make_shared<nn::Linear>(C, C));
    value_ = self->add("value_proj", std::make_shared<nn::Linear>(C, C));
    if (d_.relative_attention && !d_.share_att_key) {
      if (d_.c2p) pos_key_ = self->add("pos_key_proj", std::make_shared<nn::Linear>(C, C));
      if (d_.p2c) pos_query_ = self->add("pos_query_proj", std::make_shared<nn::Linear>(C, C));
    }
    auto attn_out = attention->add("output", std::make_shared<Container>("DebertaV2SelfOutput"));
    attn_dense_ = attn_out->add("dense", std::make_shared<nn::Linear>(C, C));
    attn_norm_ = attn_out->add("LayerNorm", std::make_shared<nn::LayerNorm>(C, c.norm_eps));
    auto inter = register_module("intermediate", std::make_shared<Container>("Intermediate"));
    inter_dense_ = inter->add("dense", std::make_shared<nn::Linear>(C, F));
    auto out = register_module("output", std::make_shared<Container>("DebertaV2Output"));
    out_dense_ = out->add("dense", std::make_shared<nn::Linear>(F, C));
    out_norm_ = out->add("LayerNorm", std::make_shared<nn::LayerNorm>(C, c.norm_eps));
  }

  Tensor forward(const Tensor& x) override {  // (B, T, C) -> (B, T, C)
    // A recomputation would backpropagate into the batch's relative embeddings, a graph shared by
    // every layer, once per layer: checkpoint the whole model instead.
    DS_CHECK(!gradient_checkpointing(),
             "[deberta] gradient checkpointing of one DeBERTa layer is not supported (the layers "
             "share the batch's relative embeddings); checkpoint the whole model, or none");
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), NH = n_head_, hd = C / NH;
    auto heads = [&](const Tensor& y) {  // (..., n, C) -> (..., NH, n, hd)
      Shape s = y.shape();
      s.back() = NH;
      s.push_back(hd);
      const int64_t nd = static_cast<int64_t>(s.size());
      return ops::contiguous(ops::transpose(ops::reshape(y, s), nd - 3, nd - 2));
    };
    const bool tr = is_training();
    const Tensor q = heads((*query_)(x)), k = heads((*key_)(x)), v = heads((*value_)(x));
    // torch: sqrt of a float32 tensor hd * scale_factor.
    const float scale = std::sqrt(static_cast<float>(hd) * static_cast<float>(d_.scale_factor()));
    Tensor s = ops::matmul(q, ops::mul(ops::transpose(k, 2, 3), 1.0f / scale));  // (B, NH, T, T)
    if (d_.relative_attention) {
      const Tensor rel = ops::dropout(batch_->rel, dropout_, tr);  // (2S, C)
      if (d_.c2p) {
        Tensor rows = ops::embedding(rel, batch_->c2p_ids);  // (2T-1, C)
        Tensor pk = heads(d_.share_att_key ? (*key_)(rows) : (*pos_key_)(rows));
        Tensor e = ops::matmul(q, ops::transpose(pk, 1, 2));  // (B, NH, T, 2T-1)
        s = ops::add(s, ops::mul(skew(e), 1.0f / scale));
      }
      if (d_.p2c) {
        Tensor rows = ops::embedding(rel, batch_->p2c_ids);  // (2T-1, C)
        Tensor pq = heads(d_.share_att_key ? (*query_)(rows) : (*pos_query_)(rows));
        Tensor e = ops::matmul(k, ops::transpose(pq, 1, 2));  // (B, NH, T_k, 2T-1)
        s = ops::add(s, ops::mul(ops::transpose(skew(e), 2, 3), 1.0f / scale));
      }
    }
    if (batch_->key_bias.defined()) s = ops::add(s, batch_->key_bias.to(s.dtype()));
    Tensor p = ops::dropout(ops::softmax(s), attn_dropout_, tr);
    Tensor a = ops::matmul(p, v);                                           // (B, NH, T, hd)
    a = ops::reshape(ops::contiguous(ops::transpose(a, 1, 2)), {B, T, C});  // (B, T, C)
    Tensor h = (*attn_norm_)(ops::add(ops::dropout((*attn_dense_)(a), dropout_, tr), x));
    Tensor f = activate(act_, (*inter_dense_)(h));  // (B, T, F)
    return (*out_norm_)(ops::add(ops::dropout((*out_dense_)(f), dropout_, tr), h));
  }

 private:
  int64_t n_head_;
  float dropout_;
  float attn_dropout_;
  std::string act_;
  DebertaOptions d_;
  std::shared_ptr<Batch> batch_;
  std::shared_ptr<nn::Linear> query_, key_, value_, pos_key_, pos_query_, attn_dense_, inter_dense_,
      out_dense_;
  std::shared_ptr<nn::LayerNorm> attn_norm_, out_norm_;
};

DebertaClassifier::DebertaClassifier(EncoderConfig config, bool init)
    : SequenceClassifier("DebertaV2ForSequenceClassification"),
      config_(std::move(config)),
      batch_(std::make_shared<Batch>()) {
  DS_CHECK(config_.is_deberta(), "[deberta] config family is \"{}\", not deberta-v2",
           config_.family);
  config_.validate();
  const EncoderConfig& c = config_;
  const DebertaOptions& d = c.deberta;
  const int64_t C = c.n_embd, E = d.embedding_dim(C);
  auto emb = register_module("embeddings", std::make_shared<Container>("DebertaV2Embeddings"));
  word_ = emb->add("word_embeddings", std::make_shared<nn::Embedding>(c.vocab_size, E));
  if (d.position_biased_input)
    position_ =
        emb->add("position_embeddings", std::make_shared<nn::Embedding>(c.max_positions, E));
  if (c.type_vocab_size > 0)
    token_type_ =
        emb->add("token_type_embeddings", std::make_shared<nn::Embedding>(c.type_vocab_size, E));
  if (E != C) embed_proj_ = emb->add("embed_proj", std::make_shared<nn::Linear>(E, C, false));
  emb_norm_ = emb->add("LayerNorm", std::make_shared<nn::LayerNorm>(C, c.norm_eps));
  auto encoder = register_module("encoder", std::make_shared<Container>("DebertaV2Encoder"));
  auto list = encoder->add("layer", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < c.n_layer; ++i)
    layers_.push_back(list->append(std::make_shared<Layer>(c, batch_)));
  if (d.relative_attention)
    rel_ = encoder->add("rel_embeddings",
                        std::make_shared<nn::Embedding>(2 * d.att_span(c.max_positions), C));
  if (d.norm_rel_ebd)
    rel_norm_ = encoder->add("LayerNorm", std::make_shared<nn::LayerNorm>(C, c.norm_eps));
  if (d.conv_kernel_size > 0) {
    auto conv = encoder->add("conv", std::make_shared<Container>("ConvLayer"));
    conv_ = conv->add("conv", std::make_shared<Conv>(C, d.conv_kernel_size, d.conv_groups));
    conv_norm_ = conv->add("LayerNorm", std::make_shared<nn::LayerNorm>(C, c.norm_eps));
  }
  auto pooler = register_module("pooler", std::make_shared<Container>("ContextPooler"));
  pooler_ = pooler->add("dense", std::make_shared<nn::Linear>(C, C));
  classifier_ = register_module("classifier", std::make_shared<nn::Linear>(C, c.num_labels));
  if (init) init_weights();
}

bool DebertaClassifier::init_parameter_range(size_t index, int64_t begin, int64_t count,
                                             float* out) const {
  if (param_names_.empty())
    for (const auto& [name, p] : named_parameters()) param_names_.push_back(name);
  DS_CHECK(index < param_names_.size(), "[deberta] parameter index {} of {}", index,
           param_names_.size());
  const std::string& name = param_names_[index];
  init_encoder_values(name, config_.initializer_range, config_.seed, index, begin, count, out);
  if (name == "embeddings.word_embeddings.weight") {  // padding_idx row
    const int64_t E = config_.deberta.embedding_dim(config_.n_embd);
    zero_span(config_.pad_token_id * E, (config_.pad_token_id + 1) * E, begin, count, out);
  }
  return true;
}

void DebertaClassifier::init_weights() {
  autograd::NoGradGuard no_grad;
  const auto named = named_parameters();
  for (size_t k = 0; k < named.size(); ++k) {
    const Tensor& p = named[k].second;
    std::vector<float> v(static_cast<size_t>(p.numel()));
    init_parameter_range(k, 0, p.numel(), v.data());
    p.detach().copy_from(Tensor::from_data(v, p.shape()).to(p.device()).to(p.dtype()));
  }
}

Tensor DebertaClassifier::embed(const EncoderInputs& in, const Tensor& mask) {
  const EncoderConfig& c = config_;
  const Tensor& ids = in.input_ids;
  const int64_t B = ids.size(0), T = ids.size(1);
  const Device dev = ids.device();
  const std::vector<int64_t> id = ids.to_int_vector();

  // (B, T, 1) 1 where the token is not the pad id: padding_idx rows get no gradient (as
  // EncoderClassifier's lookup: keep * e + (1 - keep) * e.detach() is e exactly).
  Tensor x = (*word_)(ids);  // (B, T, E)
  if (x.requires_grad() && std::find(id.begin(), id.end(), c.pad_token_id) != id.end()) {
    std::vector<float> k(id.size());
    for (size_t i = 0; i < id.size(); ++i) k[i] = id[i] == c.pad_token_id ? 0.0f : 1.0f;
    const Tensor keep = Tensor::from_data(k, {B, T, 1}).to(dev).to(x.dtype());
    x = ops::add(ops::mul(x, keep), ops::mul(x.detach(), ops::add(ops::neg(keep), 1.0f)));
  }
  if (position_) {
    DS_CHECK(T <= c.max_positions,
             "[deberta] sequence length {} exceeds the model's {} positions "
             "(max_position_embeddings); shorten the inputs",
             T, c.max_positions);
    x = ops::add(x, (*position_)(Tensor::arange(T).to(dev)));
  }
  if (token_type_) {
    Tensor types;
    if (in.token_type_ids.defined()) {
      check_ids(in.token_type_ids, "deberta", "token_type_ids", B, T);
      for (int64_t v : in.token_type_ids.to_int_vector())
        DS_CHECK(v >= 0 && v < c.type_vocab_size,
                 "[deberta] token_type_ids holds {}, outside [0, type_vocab_size {})", v,
                 c.type_vocab_size);
      types = in.token_type_ids;
    } else {
      types = Tensor::zeros({B, T}, DType::i64).to(dev);
    }
    x = ops::add(x, (*token_type_)(types));
  }
  if (embed_proj_) x = (*embed_proj_)(x);  // (B, T, C)
  x = (*emb_norm_)(x);
  if (mask.defined()) x = ops::mul(x, mask.to(x.dtype()));
  return x;
}

Tensor DebertaClassifier::encode(const EncoderInputs& in) {
  const EncoderConfig& c = config_;
  const DebertaOptions& d = c.deberta;
  check_ids(in.input_ids, "deberta", "input_ids", -1, -1);
  const int64_t B = in.input_ids.size(0), T = in.input_ids.size(1);
  DS_CHECK(B >= 1 && T >= 1, "[deberta] empty batch {}", shape_str(in.input_ids.shape()));
  const Device dev = in.input_ids.device();

  // The mask: (B, T, 1) for the embeddings and the conv, (B, 1, 1, T) key bias for the scores.
  Tensor mask;
  batch_->key_bias = Tensor();
  if (in.attention_mask.defined()) {
    check_ids(in.attention_mask, "deberta", "attention_mask", B, T);
    const std::vector<int64_t> m = in.attention_mask.to_int_vector();
    std::vector<float> keep(m.size()), bias(m.size());
    bool any = false;
    for (size_t i = 0; i < m.size(); ++i) {
      DS_CHECK(m[i] == 0 || m[i] == 1, "[deberta] attention_mask holds {}; only 0 and 1", m[i]);
      keep[i] = static_cast<float>(m[i]);
      bias[i] = m[i] ? 0.0f : -1e30f;
      any |= m[i] == 0;
    }
    for (int64_t b = 0; b < B; ++b)
      DS_CHECK(m[static_cast<size_t>(b * T)] == 1,
               "[deberta] attention_mask row {} masks token 0, which the classifier pools", b);
    if (any) {
      mask = Tensor::from_data(keep, {B, T, 1}).to(dev);
      batch_->key_bias = Tensor::from_data(bias, {B, 1, 1, T}).to(dev);
    }
  }

  Tensor x0 = embed(in, mask);  // (B, T, C)
  x0 = ops::dropout(x0, c.hidden_dropout, is_training());
  if (d.relative_attention) {
    const int64_t S = d.att_span(c.max_positions), L = 2 * T - 1;
    std::vector<int64_t> all(static_cast<size_t>(2 * S)), c2p(static_cast<size_t>(L)),
        p2c(static_cast<size_t>(L));
    for (int64_t i = 0; i < 2 * S; ++i) all[static_cast<size_t>(i)] = i;
    const int64_t maxpos =
        d.max_relative_positions >= 1 ? d.max_relative_positions : c.max_positions;
    for (int64_t m = 0; m < L; ++m) {
      const int64_t r = deberta_log_bucket(T - 1 - m, d.position_buckets, maxpos);
      c2p[static_cast<size_t>(m)] = std::clamp<int64_t>(r + S, 0, 2 * S - 1);
      p2c[static_cast<size_t>(m)] = std::clamp<int64_t>(-r + S, 0, 2 * S - 1);
    }
    // The whole table through its module's call (ZeRO-3 holds the weight only inside).
    Tensor rel = (*rel_)(Tensor::from_ints(all, {2 * S}).to(dev));  // (2S, C)
    if (rel_norm_) rel = (*rel_norm_)(rel);
    batch_->rel = rel;
    batch_->c2p_ids = Tensor::from_ints(c2p, {L}).to(dev);
    batch_->p2c_ids = Tensor::from_ints(p2c, {L}).to(dev);
  }
  Tensor x = x0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    x = (*layers_[i])(x);
    if (i == 0 && conv_) {        // ConvLayer(x0, x, mask)
      Tensor out = (*conv_)(x0);  // (B, T, C)
      if (mask.defined()) out = ops::mul(out, mask.to(out.dtype()));
      out = activate(c.deberta.conv_act, ops::dropout(out, c.hidden_dropout, is_training()));
      x = (*conv_norm_)(ops::add(x, out));
      if (mask.defined()) x = ops::mul(x, mask.to(x.dtype()));
    }
  }
  batch_->rel = Tensor();  // the graph keeps what backward needs
  batch_->key_bias = Tensor();
  return x;
}

Tensor DebertaClassifier::logits(const EncoderInputs& in) {
  Tensor x = encode(in);  // (B, T, C)
  const int64_t B = x.size(0), C = x.size(2);
  const bool tr = is_training();
  Tensor cls = ops::reshape(ops::slice(x, 1, 0, 1), {B, C});  // token 0, (B, C)
  cls = ops::dropout(cls, config_.deberta.pooler_dropout, tr);
  Tensor pooled = activate(config_.deberta.pooler_hidden_act, (*pooler_)(cls));
  return (*classifier_)(ops::dropout(pooled, config_.resolved_classifier_dropout(), tr));
}

}  // namespace ds::models
