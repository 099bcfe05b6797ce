#include "ds/nn/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include <fmt/format.h>

#include "ds/autograd/grad_mode.h"
#include "ds/autograd/node.h"
#include "ds/core/error.h"
#include "ds/nn/expert_lora.h"
#include "ds/nn/expert_parallel.h"
#include "ds/nn/grouped_linear.h"
#include "ds/ops/ops.h"

namespace ds::nn {

namespace {

// Where each token's chosen experts put it (host-side: top-k indices take no gradient).
struct Routing {
  std::vector<int64_t> chosen;  // (E) top-k choices per expert, before any is dropped
  std::vector<int64_t> counts;  // (E) rows per expert (the choices kept)
  std::vector<int64_t> order;   // (M) token of each expert-sorted row
  std::vector<int64_t> back;    // (N k) sorted row of token n's j-th choice, at n k + j; M if dropped
  std::vector<int64_t> pick;    // (N k) n E + e of token n's j-th choice (its probability)
  std::vector<float> keep;      // (N k) 0 for a dropped choice; empty when none is
};

// probs (N, E) fp32 -> top-k per token (descending, ties to the lower index as torch.topk on
// distinct values) and the expert-sorted order (tokens ascending within an expert). capacity >= 0:
// each expert keeps at most that many choices, first choices before second ones, each in token
// order (DeepSpeed's top-k gating with drop_tokens).
Routing route(const Tensor& probs, int64_t k, int64_t capacity) {
  const Tensor host = probs.detach().to(kCPU).contiguous();
  const int64_t N = host.size(0), E = host.size(1);
  const float* p = host.data<float>();
  Routing r;
  r.chosen.assign(static_cast<size_t>(E), 0);
  r.pick.resize(static_cast<size_t>(N * k));
  std::vector<int64_t> idx(static_cast<size_t>(E));
  for (int64_t n = 0; n < N; ++n) {
    const float* row = p + n * E;
    for (int64_t e = 0; e < E; ++e)
      DS_CHECK(std::isfinite(row[e]),
               "[moe] router probability of token {} is {}: the layer's input is not finite", n,
               row[e]);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int64_t a, int64_t b) {
      return row[a] > row[b] || (row[a] == row[b] && a < b);
    });
    for (int64_t j = 0; j < k; ++j) {
      r.pick[static_cast<size_t>(n * k + j)] = n * E + idx[static_cast<size_t>(j)];
      ++r.chosen[static_cast<size_t>(idx[static_cast<size_t>(j)])];
    }
  }
  auto expert_of = [&](int64_t n, int64_t j) { return r.pick[static_cast<size_t>(n * k + j)] - n * E; };
  r.counts = r.chosen;
  std::vector<char> kept(static_cast<size_t>(N * k), 1);
  if (capacity >= 0) {
    std::vector<int64_t> taken(static_cast<size_t>(E), 0);
    bool any = false;
    for (int64_t j = 0; j < k; ++j)
      for (int64_t n = 0; n < N; ++n) {
        int64_t& t = taken[static_cast<size_t>(expert_of(n, j))];
        if (t < capacity) ++t;
        else kept[static_cast<size_t>(n * k + j)] = 0, any = true;
      }
    r.counts = taken;
    if (any) r.keep.assign(kept.begin(), kept.end());
  }
  std::vector<int64_t> offset(static_cast<size_t>(E), 0);
  for (int64_t e = 1; e < E; ++e)
    offset[static_cast<size_t>(e)] =
        offset[static_cast<size_t>(e - 1)] + r.counts[static_cast<size_t>(e - 1)];
  const int64_t M = offset.back() + r.counts.back();
  r.order.resize(static_cast<size_t>(M));
  r.back.assign(static_cast<size_t>(N * k), M);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < k; ++j) {
      if (!kept[static_cast<size_t>(n * k + j)]) continue;
      const int64_t m = offset[static_cast<size_t>(expert_of(n, j))]++;
      r.order[static_cast<size_t>(m)] = n;
      r.back[static_cast<size_t>(n * k + j)] = m;
    }
  return r;
}

Tensor index_tensor(const std::vector<int64_t>& v, Device device) {
  return Tensor::from_ints(v, {static_cast<int64_t>(v.size())}).to(device);
}

}  // namespace

Tensor load_balancing_loss(const RouterLog& log) {
  DS_CHECK(!log.probs.empty(), "[moe] load_balancing_loss: no router probabilities were recorded");
  const int64_t E = log.probs[0].size(1);
  int64_t rows = 0;
  Tensor per_expert;  // (E): sum over layers and tokens of the probabilities
  for (const Tensor& p : log.probs) {
    rows += p.size(0);
    const Tensor s = ops::sum(p, {0});
    per_expert = per_expert.defined() ? ops::add(per_expert, s) : s;
  }
  // E * sum_e (counts_e / rows) * (P_e / rows): the counts are constants.
  std::vector<float> c(static_cast<size_t>(E));
  const double scale = static_cast<double>(E) / (static_cast<double>(rows) * rows);
  for (int64_t e = 0; e < E; ++e)
    c[static_cast<size_t>(e)] = static_cast<float>(log.counts[static_cast<size_t>(e)] * scale);
  const Tensor ct = Tensor::from_data(c, {E}).to(per_expert.device());
  return ops::sum(ops::mul(per_expert, ct));
}

// ---- experts ----

MoEExperts::MoEExperts(int64_t num_experts, int64_t n_embd, int64_t hidden)
    : Module("MoEExperts"), E_(num_experts), C_(n_embd), I_(hidden), total_(num_experts) {
  DS_CHECK(E_ > 0 && C_ > 0 && I_ > 0, "[moe] experts {}, n_embd {}, hidden {} must be positive",
           E_, C_, I_);
  gate_up_ = register_parameter("gate_up_proj", Tensor::zeros({E_, 2 * I_, C_}));
  down_ = register_parameter("down_proj", Tensor::zeros({E_, C_, I_}));
}

namespace {

// t (E, ...) becomes its rows [begin, end) in place: the handle keeps its identity.
void keep_rows(const Tensor& t, int64_t begin, int64_t end) {
  Shape shape = t.shape();
  shape[0] = end - begin;
  Tensor part = Tensor::empty(shape, t.dtype(), t.device());
  part.copy_from(ops::slice(t, 0, begin, end));
  TensorImpl* im = t.impl();
  im->storage = part.storage();
  im->offset = 0;
  im->shape = shape;
  im->strides = contiguous_strides(shape);
}

}  // namespace

void MoEExperts::keep(int64_t begin, int64_t end) {
  DS_CHECK(!sharded(), "[moe] the experts were split already");
  DS_CHECK(!gate_up_lora_ && !down_lora_,
           "[moe] expert parallelism with LoRA on the experts is not supported: peft's layout "
           "interleaves the experts in lora_B, so a rank's experts are not a slice of it. Train "
           "without expert_parallel.autoep_size, or leave the experts out of --lora_module_name");
  DS_CHECK(0 <= begin && begin < end && end <= E_, "[moe] experts [{}, {}) of {}", begin, end, E_);
  DS_CHECK(gate_up_.is_materialized() && down_.is_materialized(),
           "[moe] the expert weights hold no data (built under nn::PartitionedInit?); build the "
           "model whole before splitting its experts");
  keep_rows(gate_up_, begin, end);
  keep_rows(down_, begin, end);
  first_ = begin;
  E_ = end - begin;
}

std::shared_ptr<ExpertLora> MoEExperts::add_lora(const std::string& weight, int64_t r,
                                                 float scaling) {
  DS_CHECK(weight == "gate_up_proj" || weight == "down_proj",
           "[lora] the experts have no stacked weight '{}' (gate_up_proj, down_proj)", weight);
  DS_CHECK(!sharded(),
           "[lora] LoRA on the experts' {} with expert parallelism is not supported: peft's "
           "layout interleaves the experts in lora_B, so a rank's experts are not a slice of it. "
           "Train without expert_parallel.autoep_size (or leave the experts out of the targets)",
           weight);
  const bool gu = weight == "gate_up_proj";
  std::shared_ptr<ExpertLora>& slot = gu ? gate_up_lora_ : down_lora_;
  DS_CHECK(!slot, "[lora] the experts' {} already has LoRA", weight);
  slot = register_module(weight, gu ? std::make_shared<ExpertLora>(E_, 2 * I_, C_, r, scaling)
                                    : std::make_shared<ExpertLora>(E_, C_, I_, r, scaling));
  return slot;
}

Tensor MoEExperts::forward(const Tensor& xs) {
  // Through the LoRA modules' hooks (ZeRO-3 gathers their factors there).
  const Tensor gu = gate_up_lora_ ? (*gate_up_lora_)(gate_up_) : gate_up_;
  const Tensor dn = down_lora_ ? (*down_lora_)(down_) : down_;
  return run(xs, counts_, gu, dn);
}

Tensor MoEExperts::compute(const Tensor& xs, const std::vector<int64_t>& counts) const {
  const Tensor gu = gate_up_lora_ ? gate_up_lora_->forward(gate_up_) : gate_up_;
  const Tensor dn = down_lora_ ? down_lora_->forward(down_) : down_;
  return run(xs, counts, gu, dn);
}

Tensor MoEExperts::run(const Tensor& xs, const std::vector<int64_t>& counts, const Tensor& gate_up,
                       const Tensor& down) const {
  DS_CHECK(static_cast<int64_t>(counts.size()) == E_, "[moe] {} expert counts for {} experts",
           counts.size(), E_);
  const Tensor h = grouped_linear(xs, gate_up, counts);  // (M, 2I): [gate | up] per row
  const Tensor a = ops::swiglu(ops::contiguous(ops::slice(h, 1, 0, I_)),
                               ops::contiguous(ops::slice(h, 1, I_, 2 * I_)));  // (M, I)
  return grouped_linear(a, down, counts);                                       // (M, C)
}

// ---- the block's feed-forward ----

MoEMLP::MoEMLP(const BlockConfig& cfg)
    : FeedForward("MoEMLP"),
      E_(cfg.num_experts),
      k_(cfg.experts_per_tok),
      norm_topk_(cfg.norm_topk_prob),
      drop_tokens_(cfg.drop_tokens),
      capacity_factor_(cfg.capacity_factor),
      eval_capacity_factor_(cfg.eval_capacity_factor),
      min_capacity_(cfg.min_capacity),
      dropout_(cfg.dropout),
      log_(cfg.router_log) {
  DS_CHECK(cfg.tp == nullptr,
           "[moe] mixture-of-experts layers do not support tensor parallelism yet (tp size > 1)");
  DS_CHECK(!cfg.bias, "[moe] mixture-of-experts layers have no biases");
  DS_CHECK(k_ >= 1 && k_ <= E_, "[moe] experts_per_tok {} must be in [1, num_experts {}]", k_, E_);
  DS_CHECK(!cfg.geglu, "[moe] the experts are SwiGLU (geglu is not supported)");
  gate_ = register_module("gate", std::make_shared<Linear>(cfg.n_embd, E_, false));
  experts_ =
      register_module("experts", std::make_shared<MoEExperts>(E_, cfg.n_embd, cfg.moe_ffn_hidden));
  if (cfg.shared_expert_hidden > 0) {
    BlockConfig sc = cfg;  // a plain SwiGLU MLP of its own width; the block's dropout comes after
    sc.ffn_hidden = cfg.shared_expert_hidden;
    sc.dropout = 0.0f;
    shared_ = register_module("shared_expert", std::make_shared<SwiGLUMLP>(sc));
    shared_gate_ = register_module("shared_expert_gate", std::make_shared<Linear>(cfg.n_embd, 1, false));
  }
}

Tensor MoEMLP::shared(const Tensor& x2, bool decode, bool rows) const {
  const Tensor x3 = ops::reshape(x2, {1, x2.size(0), x2.size(1)});
  const Tensor h = ops::reshape(decode ? shared_->decode(x3, rows) : (*shared_)(x3), x2.shape());
  const Tensor z = decode ? shared_gate_->decode(x2, rows) : (*shared_gate_)(x2);  // (N, 1)
  // sigmoid(z) = (1 + tanh(z / 2)) / 2
  const Tensor g = ops::add(ops::mul(ops::tanh(ops::mul(z, 0.5f)), 0.5f), 0.5f);
  return ops::mul(h, g);
}

int64_t MoEMLP::capacity(int64_t tokens, bool training) const {
  if (!drop_tokens_) return -1;
  const double factor = training ? capacity_factor_ : eval_capacity_factor_;
  const auto c = static_cast<int64_t>(
      std::ceil(static_cast<double>(k_) * static_cast<double>(tokens) / static_cast<double>(E_) * factor));
  return std::max(c, min_capacity_);
}

template <class Experts>
Tensor MoEMLP::mix(const Tensor& x2, const Tensor& logits, Experts&& experts, bool record,
                   int64_t capacity) const {
  const int64_t N = x2.size(0), C = x2.size(1);
  const Tensor probs = ops::softmax(
      logits.dtype() == DType::f32 ? logits : ops::cast(logits, DType::f32));  // (N, E)
  const Routing r = route(probs, k_, capacity);
  if (record && log_ && log_->enabled) {
    log_->probs.push_back(probs);
    if (log_->counts.empty()) log_->counts.assign(static_cast<size_t>(E_), 0);
    for (int64_t e = 0; e < E_; ++e)
      log_->counts[static_cast<size_t>(e)] += r.chosen[static_cast<size_t>(e)];
  }
  const Device dev = x2.device();
  Tensor w =
      ops::embedding(ops::reshape(probs, {N * E_, 1}), index_tensor(r.pick, dev));  // (Nk, 1)
  w = ops::reshape(w, {N, k_});
  const bool dropped = !r.keep.empty();
  if (dropped) w = ops::mul(w, Tensor::from_data(r.keep, {N, k_}).to(dev));
  if (norm_topk_) {
    const Tensor sum = ops::sum(w, {1}, true);
    // A token whose every choice was dropped has weights 0 / 0: DeepSpeed clamps the sum.
    w = ops::div(w, dropped ? ops::add(sum, 1e-30f) : sum);
  }
  if (w.dtype() != x2.dtype()) w = ops::cast(w, x2.dtype());
  const Tensor xs = ops::embedding(x2, index_tensor(r.order, dev));  // (M, C) sorted by expert
  Tensor ys = experts(xs, r.counts);                                 // (M, C)
  // A dropped choice reads row M, a row of zeros.
  if (dropped) ys = ops::concat({ys, Tensor::zeros({1, C}, ys.dtype(), dev)}, 0);
  const Tensor yt = ops::embedding(ys, index_tensor(r.back, dev));  // (N k, C) token order
  return ops::sum(ops::mul(ops::reshape(yt, {N, k_, C}), ops::reshape(w, {N, k_, 1})), {1});
}

void MoEMLP::set_expert_parallel(std::shared_ptr<comm::Group> group) {
  DS_CHECK(group, "[moe] set_expert_parallel: no group");
  DS_CHECK(!ep_, "[moe] the layer's experts were split already");
  const int64_t ep = group->size();
  if (ep == 1) return;
  DS_CHECK(E_ % ep == 0,
           "[moe] expert-parallel size {} must divide the layer's {} experts (each rank holds "
           "num_experts / autoep_size of them)",
           ep, E_);
  const int64_t per = E_ / ep, r = group->rank();
  experts_->keep(r * per, (r + 1) * per);
  ep_ = std::move(group);
}

Tensor MoEMLP::run_experts(const Tensor& xs, const std::vector<int64_t>& counts) {
  if (!ep_) {
    experts_->set_counts(counts);
    return (*experts_)(xs);  // through its hooks (ZeRO-3 gathers the stacked weights there)
  }
  const int ep = ep_->size();
  const int64_t per = E_ / ep;
  const std::string ctx = fmt::format("MoE expert dispatch {}", ++calls_);
  // How many rows each rank sends each of my experts: got[s * per + l].
  std::vector<int64_t> got(static_cast<size_t>(E_));
  ep_->all_to_all(counts.data(), got.data(), static_cast<size_t>(per), DType::i64, ctx + " counts");
  std::vector<int64_t> send(static_cast<size_t>(ep), 0), recv(static_cast<size_t>(ep), 0),
      local(static_cast<size_t>(per), 0);
  for (int j = 0; j < ep; ++j)
    for (int64_t l = 0; l < per; ++l) {
      const size_t i = static_cast<size_t>(j * per + l);
      send[static_cast<size_t>(j)] += counts[i];
      recv[static_cast<size_t>(j)] += got[i];
      local[static_cast<size_t>(l)] += got[i];
    }
  const Tensor xr = all_to_all_rows(xs, send, recv, ep_, ctx);  // (R, C): (source, expert)
  // perm[i]: the row of xr that row i of the (expert, source) order takes; its inverse back.
  const int64_t R = xr.size(0);
  std::vector<int64_t> start(static_cast<size_t>(E_)), perm, back(static_cast<size_t>(R));
  perm.reserve(static_cast<size_t>(R));
  for (int64_t i = 0, at = 0; i < E_; at += got[static_cast<size_t>(i)], ++i)
    start[static_cast<size_t>(i)] = at;
  for (int64_t l = 0; l < per; ++l)
    for (int j = 0; j < ep; ++j) {
      const size_t i = static_cast<size_t>(j * per + l);
      for (int64_t k = 0; k < got[i]; ++k) {
        back[static_cast<size_t>(start[i] + k)] = static_cast<int64_t>(perm.size());
        perm.push_back(start[i] + k);
      }
    }
  const Device dev = xs.device();
  experts_->set_counts(local);
  const Tensor ye = (*experts_)(ops::embedding(xr, index_tensor(perm, dev)));  // (R, C)
  const Tensor yr = ops::embedding(ye, index_tensor(back, dev));  // (source, expert) order
  return all_to_all_rows(yr, recv, send, ep_, ctx + " combine");
}

Tensor MoEMLP::forward(const Tensor& x) {
  const Shape shape = x.shape();
  const int64_t C = shape.back();
  const Tensor x2 = ops::reshape(x, {-1, C});  // (N, C)
  auto run = [this](const Tensor& xs, const std::vector<int64_t>& counts) {
    return run_experts(xs, counts);
  };
  Tensor y = mix(x2, (*gate_)(x2), run, true, capacity(x2.size(0), is_training()));
  if (shared_) y = ops::add(y, shared(x2, /*decode=*/false, false));
  return ops::dropout(ops::reshape(y, shape), dropout_, is_training());
}

Tensor MoEMLP::decode(const Tensor& x, bool rows) const {
  DS_CHECK(!ep_,
           "[moe] decoding with the KV cache needs every expert on this rank; generate from a "
           "model loaded without expert parallelism (ds_generate, ds_serve)");
  const Shape shape = x.shape();
  const Tensor x2 = ops::reshape(x, {-1, shape.back()});
  auto run = [this](const Tensor& xs, const std::vector<int64_t>& counts) {
    return experts_->compute(xs, counts);
  };
  Tensor y = mix(x2, gate_->decode(x2, rows), run, false, /*capacity=*/-1);
  if (shared_) y = ops::add(y, shared(x2, /*decode=*/true, rows));
  return ops::reshape(y, shape);
}

}  // namespace ds::nn
