#pragma once
// Megatron-style tensor parallelism (Megatron-LM's megatron/core/tensor_parallel/layers.py and
// mappings.py; Shoeybi et al. 2019; docs/parallelism.md): the layers a transformer block is made
// of, cut across the ranks of a tensor-parallel ("model") group, and the differentiable
// collectives that join them.
//
//   auto tp = std::make_shared<ds::nn::TensorParallel>(topology.model_parallel_tp_group());
//   ColumnParallelLinear up(C, H, true, tp);     // weight (H/tp, C): output features cut
//   RowParallelLinear down(H, C, true, tp);      // weight (C, H/tp): input features cut
//   y = down(gelu(up(x)));                       // one all-reduce in forward, one in backward
//
// The two collectives ("f" and "g" in the Megatron paper):
//   tp_copy    forward: identity            backward: sum of the gradients over the group
//   tp_reduce  forward: sum over the group  backward: identity
// A column-parallel layer starts with tp_copy (each rank sees the whole input; the input's
// gradient is the sum of every rank's part); a row-parallel layer ends with tp_reduce (each rank
// holds a partial sum of the output). Between them everything is local: attention runs on this
// rank's heads, the MLP on its slice of the hidden width.
//
// The vocabulary is cut in contiguous ranges of ceil(V / tp) rows (the last shorter: GPT-2's 50257
// is odd): VocabParallelEmbedding looks up the ids it holds and sums over the group;
// vocab_parallel_cross_entropy computes the loss from each rank's logits over its range with three
// all-reduces of N values (max, sum of exponentials, target logit) and no gradient communication.
//
// Every parameter keeps the full model's name; TPSplit says which part of the full tensor a rank
// holds (initialisation draws exactly the full model's values for it: see models::GPT).
// Collectives are blocking, on the calling thread, in the same order on every rank of the group.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "ds/comm/group.h"
#include "ds/nn/layers.h"

namespace ds::nn {

// This rank's place in a tensor-parallel group. Shared by the layers of one model; immutable but
// for the cache of sharing_group() (build the model on one thread).
class TensorParallel {
 public:
  explicit TensorParallel(std::shared_ptr<comm::Group> group);
  comm::Group& group() const { return *group_; }
  int size() const { return size_; }
  int rank() const { return rank_; }
  // This rank's [begin, end) of a dimension of n elements cut into size() parts made of whole
  // `unit`s (heads: unit = head size). Even parts unless `uneven` (ceil(n / size) per rank, the
  // last ones shorter or empty). Throws naming `what` when an even cut is impossible.
  std::pair<int64_t, int64_t> part(int64_t n, int64_t unit, bool uneven, const std::string& what) const;
  // The ranks that hold the same part as this one when `copies` adjacent ranks share each part
  // (ranks r with equal r / copies): the K/V heads when there are fewer than ranks. Created by a
  // split of group() the first time a `copies` is asked for (a collective: every rank builds the
  // same layers in the same order), then cached and shared by copies of this object.
  std::shared_ptr<comm::Group> sharing_group(int copies) const;

 private:
  std::shared_ptr<comm::Group> group_;
  int size_ = 1, rank_ = 0;
  std::shared_ptr<std::map<int, std::shared_ptr<comm::Group>>> sharing_;
};

// Which part of the full tensor a rank holds.
struct TPSplit {
  int dim = -1;             // -1: replicated (the whole tensor on every rank); 0 or 1: cut there
  int64_t full = 0;         // full size along dim (all blocks)
  int64_t blocks = 1;       // dim is `blocks` equal blocks, each cut alike (GPT-2's [q | k | v])
  int64_t begin = 0, end = 0;  // this rank's range inside each block
  // Tensor-parallel ranks holding this same part: 1, or tp / n_kv_head for the K/V projections
  // when there are fewer K/V heads than ranks (adjacent ranks share a head; see kv_sharing()).
  int copies = 1;
  int64_t local() const { return blocks * (end - begin); }
  bool replicated() const { return dim < 0; }
};

Tensor tp_copy(const Tensor& x, const TensorParallel& tp);
Tensor tp_reduce(const Tensor& x, const TensorParallel& tp);
// A part held by several ranks (a K/V head shared by the ranks of `sharing`, each of which sees
// only its own query heads' share of the head's gradient): forward identity, backward the sum of
// the gradients over `sharing`, so every holder gets the whole gradient and the copies stay equal.
Tensor tp_shared(const Tensor& w, const std::shared_ptr<comm::Group>& sharing);

// Mean cross entropy over targets != ignore_index, from logits (N, V_local) holding vocabulary
// entries [vocab_begin, vocab_begin + V_local) of vocab_size. targets (N) int, the same on every
// rank of the group. Equal to ops::cross_entropy on the gathered (N, vocab_size) logits up to fp32
// summation order. The per-rank pieces are Backend kernels on the logits' device
// (vocab_ce_stats / vocab_ce_sum_exp / vocab_ce_backward); the all-reduces go through comm, by
// way of host copies of the (N) statistics for a device tensor.
Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets,
                                    int64_t vocab_begin, int64_t vocab_size,
                                    const TensorParallel& tp, int64_t ignore_index = -100);

// y = tp_copy(x) @ W^T + b with W (blocks * part, in): this rank's output features. `unit`: the
// output features move in whole units (attention heads); `blocks`: the output is `blocks` equal
// sections each cut alike (GPT-2's fused q, k, v); `uneven`: the vocabulary's ceil split.
// `share`: with fewer units than ranks (K/V heads, n_kv_head < tp, tp a multiple of n_kv_head),
// tp / units adjacent ranks hold the same unit (split().copies) and sum its gradient (tp_shared);
// Megatron's and DeepSpeed AutoTP's K/V head replication.
class ColumnParallelLinear : public Linear {
 public:
  ColumnParallelLinear(int64_t in_features, int64_t out_features, bool bias,
                       std::shared_ptr<TensorParallel> tp, int64_t unit = 1, int64_t blocks = 1,
                       bool uneven = false, bool share = false);
  // Over an existing local weight (a head tied to a VocabParallelEmbedding).
  ColumnParallelLinear(Tensor weight, TPSplit split, std::shared_ptr<TensorParallel> tp);
  Tensor forward(const Tensor& x) override;  // (..., in) -> (..., local out)
  const TPSplit& split() const { return split_; }

 private:
  static TPSplit column_split(int64_t out_features, const TensorParallel& tp, int64_t unit,
                              int64_t blocks, bool uneven, bool share);
  std::shared_ptr<TensorParallel> tp_;
  TPSplit split_;
  std::shared_ptr<comm::Group> sharing_;  // split_.copies > 1: the ranks holding the same unit
};

// y = tp_reduce(x @ W^T) + b with W (out, part of in): x holds this rank's input features; the
// bias (out) is whole on every rank and added once, after the sum.
class RowParallelLinear : public Linear {
 public:
  RowParallelLinear(int64_t in_features, int64_t out_features, bool bias,
                    std::shared_ptr<TensorParallel> tp, int64_t unit = 1);
  Tensor forward(const Tensor& x) override;  // (..., local in) -> (..., out)
  const TPSplit& split() const { return split_; }

 private:
  static int64_t local_in(int64_t in, const TensorParallel& tp, int64_t unit);
  std::shared_ptr<TensorParallel> tp_;
  TPSplit split_;
};

// Rows [begin, end) of a (V, C) embedding; ids outside give zeros before the sum over the group.
class VocabParallelEmbedding : public Embedding {
 public:
  VocabParallelEmbedding(int64_t num_embeddings, int64_t embedding_dim,
                         std::shared_ptr<TensorParallel> tp);
  Tensor forward(const Tensor& ids) override;  // (...) int -> (..., C)
  const TPSplit& split() const { return split_; }

 private:
  std::shared_ptr<TensorParallel> tp_;
  TPSplit split_;
};

// The whole tensor from every rank's part `local` (cut as `split`): an all-gather over the group
// (collective: every rank of the group calls it with its own part, in the same order). Returns
// `local` itself when split is replicated; a part held by several ranks (copies > 1) is taken
// once. Any floating dtype; the result has local's dtype.
Tensor gather_full(const Tensor& local, const TPSplit& split, const TensorParallel& tp);

// This rank's part of a whole tensor `full` as `split` describes it (a contiguous copy; `full`
// itself when replicated): the inverse of gather_full, without communication (loading whole
// weights, e.g. a Hugging Face folder, into a tensor-parallel model).
Tensor local_part(const Tensor& full, const TPSplit& split);

// Every parameter name under `root` ("h.0.attn.c_attn.weight") that one of the layers above cuts,
// with its split; parameters not listed are replicated.
std::map<std::string, TPSplit> tp_splits(const Module& root);

}  // namespace ds::nn
