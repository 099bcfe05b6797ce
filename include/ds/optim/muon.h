#pragma once
// Muon (DeepSpeed 0.19's "type": "Muon": MuonWithAuxAdam). A hybrid optimizer over one flat fp32
// range: the hidden 2-D weight matrices get Muon (SGD momentum, Nesterov, then the update
// orthogonalised by a Newton-Schulz iteration); every other tensor (embeddings, the LM head,
// biases, norm gains) gets AdamW. docs/optimizers.md has the formulas; docs/config.md the keys.
//
//   Muon opt(MuonConfig{...});
//   opt.set_tensors(tensors);            // one MuonTensor per parameter, flat order, every rank
//   opt.set_exchange(rank, size, sum);   // under ZeRO: sums a float buffer over the ranks
//   opt.step(params, grads, n, grad_scale, out16);
//
// Per Muon matrix W (R, C) with gradient G, momentum M, lr = muon_lr, wd = weight_decay:
//   M = lerp(M, G, 1 - momentum);  U = lerp(G, M, momentum)          (Nesterov)
//   O = NS(U) * sqrt(max(1, R / C));  W = W * (1 - lr * wd) - lr * O
// Everything else: AdamW (adam_update in kernels.h) with adam_lr, betas, eps, weight_decay.
//
// Under ZeRO a matrix may be cut between ranks (stages 1-2 at partition boundaries; stage 3 cuts
// every tensor). Newton-Schulz needs the whole matrix: each cut matrix has an owner rank (round
// robin over the cut matrices); the ranks' pieces of U are summed into zeroed buffers (one
// exchange: every piece lands in place, every other rank adds zeros, so the sum is exact), the
// owner orthogonalises it, a second exchange brings O to every rank, and each keeps its slice.
// Matrices held whole by one rank need no communication; matrices every rank holds whole (stage
// 0's replicas) are orthogonalised by their owner only and spread by one sum. The exchanges go in
// buckets of kMuonBucketFloats floats at most (or one matrix, when larger). Every rank must call
// step(): the exchanges are collectives.
//
// Differences from DeepSpeed, on purpose: Newton-Schulz runs in fp32 on the CPU (DeepSpeed uses
// bf16 for "standard" and fp16 for "gram" on a GPU, fp32 without one); the gradient is unscaled and
// clipped (grad_scale) before the momentum, and the clip norm is the raw gradients' (DeepSpeed's
// ZeRO applies Muon to the reduced gradient first, so its clip norm and its fp16 unscaling see the
// orthogonalised matrices); ZeRO stage 0 runs real Muon (DeepSpeed's stage 0 takes the plain
// gradient for Muon parameters).
//
// State: "exp_avg" (n floats: Muon's momentum on Muon elements, Adam's first moment elsewhere) and
// "exp_avg_sq" (n floats of address space whose pages are touched only over Adam elements, so Muon
// elements cost one float; checkpoints see both as whole per-element buffers, zeros on Muon
// elements). Threading: one thread calls step(); the kernels run on the thread pool.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ds/optim/optimizer.h"

namespace ds::optim {

enum class NsMethod { standard, gram };

// The quintic iteration's coefficients (Keller Jordan's, DeepSpeed's).
inline constexpr float kNsA = 3.4445f, kNsB = -4.7750f, kNsC = 2.0315f;
inline constexpr int kNsSteps = 5;  // DeepSpeed's muon_update default (no config key)
// Largest exchange bucket (floats) of cut matrices under ZeRO: 64 MiB of fp32 scratch per bucket.
inline constexpr int64_t kMuonBucketFloats = int64_t{16} << 20;

// The orthogonalisation of DeepSpeed's zeropower_via_newtonschulz5 ("standard") or
// zeropower_via_gram_newtonschulz ("gram", the 0.19 default; equal in exact arithmetic, cheaper
// for non-square matrices), in fp32 through the BLAS sgemm: x (rows, cols) row-major is replaced by
// NS(x). No scaling by max(1, rows/cols) here. Uses the thread pool through the BLAS.
// bf16_operands: the GEMMs' operands rounded to bf16 (DeepSpeed's precision on a GPU), fp32
// accumulation, through oneDNN on a CPU with bf16 units (about twice the fp32 rate); fp32 where
// oneDNN's bf16 GEMM is not available.
void newton_schulz(float* x, int64_t rows, int64_t cols, int steps = kNsSteps,
                   NsMethod method = NsMethod::gram, bool bf16_operands = false);

// DeepSpeed's rule for which parameters get Muon (deepspeed.set_optimizer_flags): two or more
// dimensions and a lower-cased name without "embed" or "lm_head". We also keep GPT-2's "wte" and
// "wpe" on Adam: they are the embeddings DeepSpeed's rule means, under names it does not match.
bool muon_uses(const std::string& name, std::span<const int64_t> shape);

struct MuonConfig {
  float muon_lr = 0.02f;  // "muon_lr", else "lr", else 0.02
  float adam_lr = 3e-4f;  // "adam_lr", else "lr", else 3e-4
  float momentum = 0.95f;
  float weight_decay = 0.0f;  // both groups
  float beta1 = 0.9f, beta2 = 0.95f;
  float eps = 1e-10f;
  NsMethod ns_method = NsMethod::gram;
  int ns_steps = kNsSteps;
  // Newton-Schulz GEMMs with bf16 operands (newton_schulz); from DS_MUON_NS=bf16 (default fp32).
  bool ns_bf16 = false;
  // The lr the schedule scales: set_lr(x) multiplies both groups' lrs by x / base_lr (config "lr").
  float base_lr = 0.02f;
};

// The MuonConfig of make_optimizer("Muon", p): DeepSpeed's lr precedence (see MuonConfig).
MuonConfig muon_config(const OptimizerParams& p);

// One parameter tensor as this rank sees it (set_tensors: every tensor of the model, flat order,
// the same list on every rank apart from the piece fields).
struct MuonTensor {
  int64_t rows = 0, cols = 0;  // the matrix (rows * cols = the tensor's numel); Adam: (1, numel)
  bool use_muon = false;
  int64_t local_offset = 0;  // where this rank's piece starts in the optimizer range
  int64_t start = 0;         // the piece's first element within the tensor
  int64_t count = 0;         // the piece's elements (0 where another rank holds the tensor)
};

class Muon final : public Optimizer {
 public:
  explicit Muon(const MuonConfig& c);
  const char* name() const override { return "Muon"; }
  // Muon elements keep 1 float, Adam elements 2: rounded up here; state_bytes() is exact.
  int state_floats_per_param() const override;
  int64_t state_bytes() const override;
  const MuonConfig& config() const { return c_; }

  // The tensors of the optimizer range (before the first step). Without it the whole range is
  // one Adam tensor.
  void set_tensors(std::vector<MuonTensor> tensors);
  // Under ZeRO: `sum` adds a float buffer elementwise over the `size` ranks (in place, on every
  // rank). Not set: one process.
  void set_exchange(int rank, int size, std::function<void(float* buf, int64_t count)> sum);
  const std::vector<MuonTensor>& tensors() const { return tensors_; }
  int64_t muon_numel() const;  // this rank's elements stepped by Muon
  // Muon matrices no rank holds whole (exchanged each step); known after the first step.
  size_t cut_matrices() const { return cut_.size(); }
  // Muon matrices every rank holds whole (ZeRO stage 0 on several ranks): each is orthogonalised
  // by one owner and the result summed to all, instead of by every rank.
  size_t shared_matrices() const { return shared_.size(); }

  // lr(): the schedule's lr (base_lr scaled); both groups follow it proportionally.
  float lr() const override { return lr_; }
  void set_lr(float lr) override;
  float weight_decay() const override { return c_.weight_decay; }
  void set_weight_decay(float wd) override;
  float momentum() const override { return c_.momentum; }
  void set_momentum(float m) override;
  std::pair<float, float> betas() const override { return {c_.beta1, c_.beta2}; }
  void set_betas(float beta1, float beta2) override;
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  std::vector<StateBuffer> state_buffers() override;
  std::map<std::string, double> scalar_state() const override;
  void load_scalar_state(const std::map<std::string, double>& s) override;
  ~Muon() override;

 private:
  void on_init_state() override;
  void do_step(float* params, const float* grads, float grad_scale, void* out16,
               DType out16_dtype) override;
  void step_adam(float* params, const float* grads, float grad_scale, void* out16, DType dt);
  void step_whole(float* params, const float* grads, float grad_scale, void* out16, DType dt);
  // The cut (assemble: summed from the ranks' pieces first) or shared (every rank holds them
  // whole) matrices of `list`: one owner each orthogonalises, a sum spreads the result.
  void step_exchanged(const std::vector<int>& list,
                      const std::vector<std::pair<size_t, size_t>>& buckets, bool assemble,
                      float* params, const float* grads, float grad_scale, void* out16, DType dt);
  void plan_cut();               // first step: which matrices are cut or shared, their buckets
  void release_muon_sq_pages();  // drops exp_avg_sq pages that lie wholly on Muon elements
  float group_lr(float base) const;

  MuonConfig c_;
  float lr_;
  std::vector<MuonTensor> tensors_;
  int rank_ = 0, size_ = 1;
  std::function<void(float*, int64_t)> sum_;
  bool planned_ = false;
  std::vector<int> cut_;         // the Muon matrices no rank holds whole (indices, every rank)
  std::vector<int> shared_;      // those every rank holds whole (stage 0 on several ranks)
  std::vector<char> exchanged_;  // per tensor: in cut_ or shared_
  std::vector<std::pair<size_t, size_t>> cut_buckets_, shared_buckets_;  // [first, last)
  float* sq_ = nullptr;  // exp_avg_sq: n_ floats of mmap'd address space
  size_t sq_bytes_ = 0;
  bool trim_pending_ = false;
};

}  // namespace ds::optim
