// Muon's optimizer step and state memory against AdamW's over the tensors of a GPT-2 model
// (default 124M: 12 layers, C 768, V 50257, T 1024), one process, fp32, measured in the same run.
// Prints the median step time of each, the ratio, and the state bytes of each.
//
//   OMP_NUM_THREADS=2 build/bench/bench_muon [--layers 12] [--embd 768] [--steps 5] [--ns gram]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ds/optim/muon.h"

using namespace ds;

namespace {

struct Spec {
  std::string name;
  std::vector<int64_t> shape;
};

// GPT-2's parameters (names as nn::GPT's; lm_head tied to wte).
std::vector<Spec> gpt2(int64_t L, int64_t C, int64_t V, int64_t T) {
  std::vector<Spec> s = {{"wte.weight", {V, C}}, {"wpe.weight", {T, C}}};
  for (int64_t l = 0; l < L; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    s.push_back({h + "ln_1.weight", {C}});
    s.push_back({h + "ln_1.bias", {C}});
    s.push_back({h + "attn.c_attn.weight", {3 * C, C}});
    s.push_back({h + "attn.c_attn.bias", {3 * C}});
    s.push_back({h + "attn.c_proj.weight", {C, C}});
    s.push_back({h + "attn.c_proj.bias", {C}});
    s.push_back({h + "ln_2.weight", {C}});
    s.push_back({h + "ln_2.bias", {C}});
    s.push_back({h + "mlp.c_fc.weight", {4 * C, C}});
    s.push_back({h + "mlp.c_fc.bias", {4 * C}});
    s.push_back({h + "mlp.c_proj.weight", {C, 4 * C}});
    s.push_back({h + "mlp.c_proj.bias", {C}});
  }
  s.push_back({"ln_f.weight", {C}});
  s.push_back({"ln_f.bias", {C}});
  return s;
}

double median_step(optim::Optimizer& opt, std::vector<float>& p, const std::vector<float>& g,
                   int steps) {
  std::vector<double> t;
  for (int i = 0; i <= steps; ++i) {  // the first step (allocation, first touch) is not counted
    const auto a = std::chrono::steady_clock::now();
    opt.step(p.data(), g.data(), static_cast<int64_t>(p.size()));
    const auto b = std::chrono::steady_clock::now();
    if (i > 0) t.push_back(std::chrono::duration<double>(b - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t L = 12, C = 768;
  int steps = 5;
  std::string ns = "gram";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--layers")
      L = std::atoll(argv[i + 1]);
    else if (k == "--embd")
      C = std::atoll(argv[i + 1]);
    else if (k == "--steps")
      steps = std::atoi(argv[i + 1]);
    else if (k == "--ns")
      ns = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  const auto specs = gpt2(L, C, 50257, 1024);
  std::vector<optim::MuonTensor> tensors;
  int64_t n = 0, muon = 0;
  double flops = 0;  // the standard iteration's: 5 x (X X^T, A A, B X) on the wide orientation
  for (const auto& s : specs) {
    int64_t numel = 1;
    for (int64_t d : s.shape) numel *= d;
    const bool use = optim::muon_uses(s.name, s.shape);
    tensors.push_back({use ? s.shape[0] : 1, use ? numel / s.shape[0] : numel, use, n, 0, numel});
    n += numel;
    muon += use ? numel : 0;
    if (use) {
      const double a = static_cast<double>(std::min(s.shape[0], numel / s.shape[0]));
      const double b = static_cast<double>(numel) / a;
      flops += optim::kNsSteps * (2 * a * a * b + 2 * a * a * a + 2 * a * a * b);
    }
  }
  std::vector<float> p(static_cast<size_t>(n)), g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    p[static_cast<size_t>(i)] = 0.02f * static_cast<float>((i * 7919) % 1000 - 500) / 500.0f;
    g[static_cast<size_t>(i)] = 1e-3f * static_cast<float>((i * 104729) % 1000 - 500) / 500.0f;
  }
  optim::OptimizerParams op;
  op.lr = 3e-4f;
  op.weight_decay = 0.1f;
  auto adam = optim::make_optimizer("AdamW", op);
  const double t_adam = median_step(*adam, p, g, steps);
  op.lr_given = false;
  op.momentum = 0.95f;
  op.beta2 = 0.95f;
  op.eps = 1e-10f;
  op.ns_method = ns;
  auto m = optim::make_optimizer("Muon", op);
  static_cast<optim::Muon&>(*m).set_tensors(tensors);
  const double t_muon = median_step(*m, p, g, steps);
  std::printf("GPT-2 L=%lld C=%lld: %.1f M parameters, %.1f M (%.1f%%) in Muon matrices\n",
              static_cast<long long>(L), static_cast<long long>(C), n / 1e6, muon / 1e6,
              100.0 * static_cast<double>(muon) / static_cast<double>(n));
  std::printf("optimizer step (median of %d): AdamW %.3f s, Muon (%s) %.3f s, Muon/AdamW %.2fx\n",
              steps, t_adam, ns.c_str(), t_muon, t_muon / t_adam);
  std::printf("Newton-Schulz operands: %s (DS_MUON_NS)\n",
              static_cast<optim::Muon&>(*m).config().ns_bf16 ? "bf16" : "fp32");
  std::printf(
      "Newton-Schulz: %.1f GFLOP per step as the standard iteration counts them, %.1f "
      "GFLOP/s of that\n",
      flops / 1e9, flops / 1e9 / t_muon);
  std::printf("optimizer state: AdamW %.1f MiB, Muon %.1f MiB, Muon/AdamW %.3f\n",
              adam->state_bytes() / 1048576.0, m->state_bytes() / 1048576.0,
              static_cast<double>(m->state_bytes()) / static_cast<double>(adam->state_bytes()));
  return 0;
}
