// Tensor-parallel layers and collectives (ds/nn/tensor_parallel.h).
#include "ds/nn/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ds/autograd/node.h"
#include "ds/backend/backend.h"
#include "ds/core/error.h"
#include "ds/core/parallel.h"
#include "ds/ops/ops.h"

namespace ds::nn {

TensorParallel::TensorParallel(std::shared_ptr<comm::Group> group)
    : group_(std::move(group)),
      sharing_(std::make_shared<std::map<int, std::shared_ptr<comm::Group>>>()) {
  DS_CHECK(group_, "[tensor parallel] needs a group");
  size_ = group_->size();
  rank_ = group_->rank();
}

std::shared_ptr<comm::Group> TensorParallel::sharing_group(int copies) const {
  DS_CHECK(copies >= 1 && size_ % copies == 0,
           "[tensor parallel] {} ranks cannot share parts {} at a time", size_, copies);
  auto& g = (*sharing_)[copies];
  if (!g) g = group_->split(rank_ / copies, rank_);
  return g;
}

std::pair<int64_t, int64_t> TensorParallel::part(int64_t n, int64_t unit, bool uneven,
                                                 const std::string& what) const {
  DS_CHECK(unit >= 1 && n % unit == 0, "[tensor parallel] {}: {} is not a multiple of {}", what, n,
           unit);
  const int64_t units = n / unit;
  if (!uneven)
    DS_CHECK(units % size_ == 0,
             "[tensor parallel] {}: {} cannot be cut into {} equal parts{}; choose a "
             "tensor_parallel size that divides it",
             what, units, size_, unit > 1 ? fmt::format(" (of {} elements each)", unit) : "");
  const int64_t per = (units + size_ - 1) / size_;
  const int64_t b = std::min(units, per * rank_), e = std::min(units, b + per);
  return {b * unit, e * unit};
}

// ---- collectives ----

namespace {

Tensor summed(const Tensor& x, const TensorParallel& tp, const char* what) {
  Tensor out = x.detach().clone();
  tp.group().all_reduce(out, comm::ReduceOp::sum, what);
  return out;
}

}  // namespace

Tensor tp_copy(const Tensor& x, const TensorParallel& tp) {
  if (tp.size() == 1) return x;
  Tensor out = x.detach();
  // A copy (a group handle and two ints): the graph may outlive the layer that made it.
  return autograd::record(out, "TPCopyBackward", {x}, [t = tp](const Tensor& g) -> std::vector<Tensor> {
    return {summed(g, t, "tensor parallel: input gradient")};
  });
}

Tensor tp_reduce(const Tensor& x, const TensorParallel& tp) {
  if (tp.size() == 1) return x;
  Tensor out = summed(x, tp, "tensor parallel: partial outputs");
  return autograd::record(out, "TPReduceBackward", {x},
                          [](const Tensor& g) -> std::vector<Tensor> { return {g}; });
}

Tensor tp_shared(const Tensor& w, const std::shared_ptr<comm::Group>& sharing) {
  if (!sharing || sharing->size() == 1) return w;
  Tensor out = w.detach();
  return autograd::record(out, "TPSharedBackward", {w},
                          [sharing](const Tensor& g) -> std::vector<Tensor> {
                            Tensor sum = g.detach().clone();
                            sharing->all_reduce(sum, comm::ReduceOp::sum,
                                                "tensor parallel: gradient of a shared K/V head");
                            return {sum};
                          });
}

// ---- cross entropy over a cut vocabulary ----

namespace {

// All-reduces t in place over the tensor-parallel group (a device tensor through host memory:
// comm's Tensor overloads; N statistics per step).
void all_reduced(Tensor& t, comm::ReduceOp op, const TensorParallel& tp, const char* what) {
  tp.group().all_reduce(t, op, what);
}

}  // namespace

Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets,
                                    int64_t vocab_begin, int64_t vocab_size,
                                    const TensorParallel& tp, int64_t ignore_index) {
  DS_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0),
           "[tensor parallel] cross entropy needs logits (N, V_local) and targets (N), got {} and {}",
           shape_str(logits.shape()), shape_str(targets.shape()));
  const int64_t N = logits.size(0), Vl = logits.size(1);
  DS_CHECK(vocab_begin >= 0 && vocab_begin + Vl <= vocab_size,
           "[tensor parallel] vocabulary range [{}, {}) outside {} entries", vocab_begin,
           vocab_begin + Vl, vocab_size);
  const std::vector<int64_t> t = targets.contiguous().to_int_vector();
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t v = t[static_cast<size_t>(n)];
    if (v == ignore_index) continue;
    DS_CHECK(v >= 0 && v < vocab_size,
             "[cross_entropy] target {} (at position {}) is out of range for {} classes "
             "(ignore_index is {})",
             v, n, vocab_size, ignore_index);
    ++count;
  }
  // The statistics come from the logits' backend; only the all-reduces (comm/) and the (N)
  // statistics that make the scalar loss are on the host.
  const Tensor fl = logits.detach().to(DType::f32).contiguous();
  const Device dev = fl.device();
  backend::Backend& be = backend::get(dev);
  const Tensor tc = targets.contiguous();
  Tensor mx = Tensor::empty({N}, DType::f32, dev), se = Tensor::empty({N}, DType::f32, dev);
  Tensor tl = Tensor::empty({N}, DType::f32, dev);
  be.vocab_ce_stats(fl, tc, vocab_begin, mx, tl);
  all_reduced(mx, comm::ReduceOp::max, tp, "tensor parallel: logit maxima");
  be.vocab_ce_sum_exp(fl, mx, se);
  all_reduced(se, comm::ReduceOp::sum, tp, "tensor parallel: sums of exponentials");
  all_reduced(tl, comm::ReduceOp::sum, tp, "tensor parallel: target logits");
  const std::vector<float> M = mx.to_vector(), S = se.to_vector(), TL = tl.to_vector();
  double total = 0.0;
  for (int64_t n = 0; n < N; ++n)
    if (t[static_cast<size_t>(n)] != ignore_index)
      total += static_cast<double>(std::log(S[n]) + M[n] - TL[n]);
  const float loss = count > 0 ? static_cast<float>(total / static_cast<double>(count)) : 0.0f;
  Tensor out = Tensor::full({}, loss, DType::f32, dev);
  const DType dt = logits.dtype();
  return autograd::record(
      out, "VocabParallelCrossEntropyBackward", {logits},
      [=](const Tensor& g) -> std::vector<Tensor> {
        const float scale = count > 0 ? g.item() / static_cast<float>(count) : 0.0f;
        Tensor d = Tensor::empty({N, Vl}, DType::f32, dev);
        backend::get(dev).vocab_ce_backward(fl, tc, vocab_begin, ignore_index, mx, se, scale, d);
        return {dt == DType::f32 ? d : ops::cast(d, dt).detach()};
      });
}

// ---- layers ----

TPSplit ColumnParallelLinear::column_split(int64_t out_features, const TensorParallel& tp,
                                           int64_t unit, int64_t blocks, bool uneven, bool share) {
  DS_CHECK(blocks >= 1 && out_features % blocks == 0,
           "[tensor parallel] {} output features are not {} equal blocks", out_features, blocks);
  const int64_t per_block = out_features / blocks;
  if (share && unit >= 1 && per_block % unit == 0 && per_block / unit < tp.size()) {
    // Fewer units (K/V heads) than ranks: `copies` adjacent ranks hold each one.
    const int64_t units = per_block / unit;
    DS_CHECK(blocks == 1 && !uneven && tp.size() % units == 0,
             "[tensor parallel] K/V heads: {} heads cannot be cut into {} equal parts, nor "
             "shared by equal groups of the {} ranks; choose a tensor_parallel size that divides "
             "n_kv_head ({}) or is a multiple of it",
             units, tp.size(), tp.size(), units);
    const int copies = static_cast<int>(tp.size() / units);
    const int64_t b = (tp.rank() / copies) * unit;
    return {0, out_features, 1, b, b + unit, copies};
  }
  auto [b, e] = tp.part(per_block, unit, uneven, "column-parallel output features");
  DS_CHECK(e > b, "[tensor parallel] rank {} of {} would hold no output features of {}",
           tp.rank(), tp.size(), out_features);
  return {0, out_features, blocks, b, e};
}

ColumnParallelLinear::ColumnParallelLinear(int64_t in_features, int64_t out_features, bool bias,
                                           std::shared_ptr<TensorParallel> tp, int64_t unit,
                                           int64_t blocks, bool uneven, bool share)
    : Linear(in_features, column_split(out_features, *tp, unit, blocks, uneven, share).local(),
             bias),
      tp_(std::move(tp)),
      split_(column_split(out_features, *tp_, unit, blocks, uneven, share)) {
  if (split_.copies > 1) sharing_ = tp_->sharing_group(split_.copies);
}

ColumnParallelLinear::ColumnParallelLinear(Tensor weight, TPSplit split,
                                           std::shared_ptr<TensorParallel> tp)
    : Linear(std::move(weight)), tp_(std::move(tp)), split_(split) {}

Tensor ColumnParallelLinear::forward(const Tensor& x) {
  if (!sharing_) return Linear::forward(tp_copy(x, *tp_));
  const Tensor b = bias().defined() ? tp_shared(bias(), sharing_) : Tensor();
  return ops::linear(tp_copy(x, *tp_), tp_shared(weight(), sharing_), b);
}

int64_t RowParallelLinear::local_in(int64_t in, const TensorParallel& tp, int64_t unit) {
  auto [b, e] = tp.part(in, unit, false, "row-parallel input features");
  return e - b;
}

RowParallelLinear::RowParallelLinear(int64_t in_features, int64_t out_features, bool bias,
                                     std::shared_ptr<TensorParallel> tp, int64_t unit)
    : Linear(local_in(in_features, *tp, unit), out_features, bias), tp_(std::move(tp)) {
  auto [b, e] = tp_->part(in_features, unit, false, "row-parallel input features");
  split_ = {1, in_features, 1, b, e};
}

Tensor RowParallelLinear::forward(const Tensor& x) {
  Tensor y = tp_reduce(ops::linear(x, weight(), {}), *tp_);
  return bias().defined() ? ops::add(y, bias()) : y;
}

VocabParallelEmbedding::VocabParallelEmbedding(int64_t num_embeddings, int64_t embedding_dim,
                                               std::shared_ptr<TensorParallel> tp)
    : Embedding(
          [&] {
            auto [b, e] = tp->part(num_embeddings, 1, true, "vocabulary");
            DS_CHECK(e > b, "[tensor parallel] rank {} of {} would hold no rows of a {}-entry "
                     "vocabulary", tp->rank(), tp->size(), num_embeddings);
            return e - b;
          }(),
          embedding_dim),
      tp_(std::move(tp)) {
  auto [b, e] = tp_->part(num_embeddings, 1, true, "vocabulary");
  split_ = {0, num_embeddings, 1, b, e};
}

Tensor VocabParallelEmbedding::forward(const Tensor& ids) {
  if (tp_->size() == 1) return Embedding::forward(ids);
  const std::vector<int64_t> v = ids.contiguous().to_int_vector();
  std::vector<int64_t> local(v.size());
  std::vector<float> keep(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const bool mine = v[i] >= split_.begin && v[i] < split_.end;
    local[i] = mine ? v[i] - split_.begin : 0;
    keep[i] = mine ? 1.0f : 0.0f;
  }
  Shape mask_shape = ids.shape();
  mask_shape.push_back(1);
  const Device dev = weight().device();
  Tensor rows = ops::embedding(weight(), Tensor::from_ints(local, ids.shape()).to(dev));  // (..., C)
  Tensor mask = Tensor::from_data(keep, mask_shape).to(dev).to(rows.dtype());
  return tp_reduce(ops::mul(rows, mask), *tp_);
}

Tensor gather_full(const Tensor& local, const TPSplit& s, const TensorParallel& tp) {
  if (s.replicated() || tp.size() == 1) return local;
  DS_CHECK(local.dim() >= 1 && local.dim() <= 2 && s.dim < local.dim(),
           "[tensor parallel] gather_full: a 1-d or 2-d part cut along an existing dimension, got "
           "{} cut along {}",
           shape_str(local.shape()), s.dim);
  // Every rank's range inside a block is [min(Fb, r*per), min(Fb, (r+1)*per)) (part()'s rule);
  // parts are padded to `per` so that the all-gather moves equal chunks.
  const int n = tp.size();
  const int64_t len = s.end - s.begin;
  // Shared parts (copies > 1): rank r holds the (r / copies)-th of n / copies equal ranges.
  const int64_t Fb = s.full / s.blocks, per = s.copies > 1 ? len : (Fb + n - 1) / n;
  auto range = [&](int r) {
    const int64_t b = std::min(Fb, (s.copies > 1 ? r / s.copies : r) * per);
    return std::pair<int64_t, int64_t>{b, std::min(Fb, b + per)};
  };
  // Both cuts as (rows, blocks, cut, cols): dim 0 of a (blocks * len, cols) part is (1, blocks,
  // len, cols); dim 1 of a (rows, len) part is (rows, 1, len, 1). Packing and unpacking are
  // strided copies on the part's device (Backend::copy); comm moves the packed parts.
  const Device dev = local.device();
  const Tensor x = local.detach().to(DType::f32).contiguous();
  const int64_t rows = s.dim == 0 ? 1 : local.size(0);
  const int64_t cols = s.dim == 0 && local.dim() == 2 ? local.size(1) : 1;
  DS_CHECK(s.dim == 0 || s.blocks == 1, "[tensor parallel] gather_full: blocks along dimension 1");
  const Shape packed{rows, s.blocks, per, cols};
  Tensor send = Tensor::zeros(packed, DType::f32, dev);
  ops::slice(send, 2, 0, len).copy_from(ops::reshape(x, {rows, s.blocks, len, cols}));
  Tensor recv = Tensor::empty({n, rows, s.blocks, per, cols}, DType::f32, dev);
  tp.group().all_gather(send, recv, "tensor parallel: gathering a parameter");
  Shape full_shape = local.shape();
  full_shape[static_cast<size_t>(s.dim)] = s.full;
  Tensor full = Tensor::zeros(full_shape, DType::f32, dev);
  const Tensor full4 = ops::reshape(full, {rows, s.blocks, Fb, cols});
  for (int r = 0; r < n; r += s.copies) {  // a shared part from the first of its holders
    const auto [b, e] = range(r);
    if (e == b) continue;
    const Tensor part = ops::reshape(ops::slice(recv, 0, r, r + 1), packed);
    ops::slice(full4, 2, b, e).copy_from(ops::slice(part, 2, 0, e - b));
  }
  return local.dtype() == DType::f32 ? full : full.to(local.dtype());
}

Tensor local_part(const Tensor& full, const TPSplit& s) {
  if (s.replicated()) return full;
  DS_CHECK(
      s.dim < full.dim() && full.size(s.dim) == s.full && s.blocks >= 1 && s.full % s.blocks == 0,
      "[tensor parallel] local_part: a tensor {} cannot hold a part cut along {} of {} "
      "elements",
      shape_str(full.shape()), s.dim, s.full);
  const Tensor x = full.detach();
  const int64_t per_block = s.full / s.blocks;
  std::vector<Tensor> pieces;
  for (int64_t j = 0; j < s.blocks; ++j)
    pieces.push_back(ops::slice(x, s.dim, j * per_block + s.begin, j * per_block + s.end));
  return ops::contiguous(pieces.size() == 1 ? pieces[0] : ops::concat(pieces, s.dim));
}

std::map<std::string, TPSplit> tp_splits(const Module& root) {
  std::map<std::string, TPSplit> out;
  for (const auto& [name, m] : root.named_modules()) {
    const std::string prefix = name.empty() ? "" : name + ".";
    if (auto* c = dynamic_cast<const ColumnParallelLinear*>(m)) {
      out[prefix + "weight"] = c->split();
      if (c->bias().defined()) out[prefix + "bias"] = c->split();
    } else if (auto* r = dynamic_cast<const RowParallelLinear*>(m)) {
      out[prefix + "weight"] = r->split();  // the bias is whole on every rank
    } else if (auto* e = dynamic_cast<const VocabParallelEmbedding*>(m)) {
      out[prefix + "weight"] = e->split();
    }
  }
  return out;
}

}  // namespace ds::nn
