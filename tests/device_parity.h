#pragma once
// Host-versus-device checks a model family's tests share (test_hf_families, test_hf_encoders,
// test_hf_deberta, test_hf_seq2seq): two copies of one model, one moved to a device (the `sim`
// emulator: memory the host cannot dereference, the CPU's kernels; docs/architecture.md "The sim
// device"), must give the same loss, the same gradient of every parameter, the same engine losses
// under ZeRO 0 and 3, and the same greedy tokens. A host read of device memory anywhere on the
// way crashes (SIGSEGV) instead of passing.
//
//   auto make = [&] { return import(dir); };             // a fresh host copy each call
//   ds::testing::expect_device_as_host(make, batch, ds::testing::sim_device(), 0.0);
//
// tol 0 asks for bitwise equality (only the CPU's kernels ran); otherwise each tensor's
// max |dev - host| / max |host| <= tol (a Backend default kernel ran on the device: the caller's
// comment says which). Batches are host tensors: moved to the device for a direct call, passed as
// they are to the engine (Engine::forward moves them).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ds/backend/backend.h"
#include "ds/core/device.h"
#include "ds/core/rng.h"
#include "ds/core/tensor.h"
#include "ds/models/incremental_decoder.h"
#include "ds/nn/batch.h"
#include "ds/nn/module.h"
#include "ds/runtime/engine.h"
#include "hf_fixture.h"

namespace ds::testing {

// sim:0, registered (backend::get must run before a sim tensor is made).
inline Device sim_device() {
  const Device d{DeviceType::sim, 0};
  backend::get(d);
  return d;
}

// b with every defined tensor on device.
inline nn::Batch batch_on(const nn::Batch& b, Device device) {
  auto on = [&](const Tensor& t) { return t.defined() ? t.to(device) : Tensor(); };
  return {on(b.input_ids), on(b.labels), on(b.attention_mask), on(b.token_type_ids),
          on(b.decoder_input_ids)};
}

// Equal (tol 0) or within max|got - want| / max|want| <= tol.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol,
                         const std::string& what) {
  if (tol == 0.0)
    EXPECT_EQ(got, want) << what << " differs from the host's";
  else
    EXPECT_LE(rel_err(got, want), tol) << what;
}

// (1) host and dev (the same weights, dev already moved to device, both in the same mode): the
// loss of b and, after backward, every parameter's gradient; the gradients stay on the device.
// Returns the worst relative gradient difference.
inline double expect_loss_and_gradients_as_host(nn::Module& host, nn::Module& dev,
                                                const nn::Batch& b, Device device, double tol) {
  Tensor want_loss = host.loss(b);
  Tensor got_loss = dev.loss(batch_on(b, device));
  EXPECT_EQ(got_loss.device(), device) << "the loss left the device";
  expect_close({got_loss.item()}, {want_loss.item()}, tol, "loss");
  want_loss.backward();
  got_loss.backward();
  const auto h = host.named_parameters(), d = dev.named_parameters();
  EXPECT_EQ(h.size(), d.size());
  const size_t n = std::min(h.size(), d.size());
  std::vector<std::vector<float>> got(n), want(n);
  double largest = 0.0;  // of every host gradient
  for (size_t i = 0; i < n; ++i) {
    const auto& [name, p] = d[i];
    EXPECT_EQ(p.device(), device) << name << " left the device";
    if (!p.grad().defined() || !h[i].second.grad().defined()) {
      EXPECT_EQ(p.grad().defined(), h[i].second.grad().defined()) << name;
      continue;
    }
    EXPECT_EQ(p.grad().device(), device) << "gradient of " << name << " left the device";
    got[i] = p.grad().to_vector();
    want[i] = h[i].second.grad().to_vector();
    for (float v : want[i]) largest = std::max(largest, std::abs(static_cast<double>(v)));
  }
  // A gradient that is zero in exact arithmetic (an attention key bias: softmax ignores what it
  // adds to every score of a query) holds rounding noise on both sides: below 1e-6 of the largest
  // gradient, a tensor is measured against the largest instead of itself.
  double worst = 0.0;
  for (size_t i = 0; i < n; ++i) {
    if (tol == 0.0) {
      EXPECT_EQ(got[i], want[i]) << "gradient of " << d[i].first << " differs from the host's";
      continue;
    }
    double diff = 0.0, scale = 0.0;
    for (size_t k = 0; k < std::min(got[i].size(), want[i].size()); ++k) {
      diff = std::max(diff, std::abs(static_cast<double>(got[i][k]) - want[i][k]));
      scale = std::max(scale, std::abs(static_cast<double>(want[i][k])));
    }
    const double e = diff / std::max(scale < 1e-6 * largest ? largest : scale, 1e-30);
    EXPECT_LE(e, tol) << "gradient of " << d[i].first;
    worst = std::max(worst, e);
  }
  return worst;
}

// The losses of `steps` engine steps (AdamW lr 1e-3, weight decay 0.1, ZeRO `stage`, parameters
// gathered per module at stage 3) on b, the model's own loss (Module::loss(const Batch&)).
inline std::vector<float> engine_losses(std::shared_ptr<nn::Module> model, int stage,
                                        const nn::Batch& b, int steps) {
  rng::dropout_state() = {};
  runtime::InitOptions opt;
  opt.log = [](const std::string&) {};
  auto engine = runtime::initialize(
      model,
      fmt::format(R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 1,
        "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-3, "weight_decay": 0.1}}}},
        "zero_optimization": {{"stage": {}, "stage3_param_persistence_threshold": 0}}}})",
                  b.input_ids.size(0), stage),
      opt);
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    Tensor loss = engine->forward(b);
    engine->backward(loss);
    engine->step();
    losses.push_back(loss.item());
  }
  return losses;
}

// (1) and (2) for the model make() builds (a fresh host copy each call, with its weights loaded):
// loss and gradients of b in the mode make() leaves, then three engine steps at ZeRO 0 and 3 in
// training mode, the device copy's against the host's.
inline void expect_device_as_host(const std::function<std::shared_ptr<nn::Module>()>& make,
                                  const nn::Batch& b, Device device, double tol) {
  {
    auto host = make(), dev = make();
    dev->to(device);
    const double worst = expect_loss_and_gradients_as_host(*host, *dev, b, device, tol);
    std::printf("on %s: worst gradient difference from the host %.2e\n", device.str().c_str(),
                worst);
  }
  for (int stage : {0, 3}) {
    SCOPED_TRACE(fmt::format("ZeRO stage {}", stage));
    const std::vector<float> want = engine_losses(make(), stage, b, 3);
    auto dev = make();
    dev->to(device);
    expect_close(engine_losses(dev, stage, b, 3), want, tol, "engine losses");
    for (const auto& [name, p] : dev->named_parameters())
      EXPECT_EQ(p.device(), device) << name << " left the device in the engine";
  }
}

// (3) n greedy tokens (argmax of the host logits forward() returns) after prompt; every step's
// logits are appended to *logits.
inline std::vector<int32_t> greedy_tokens(models::IncrementalDecoder& d,
                                          std::span<const int32_t> prompt, int n,
                                          std::vector<float>* logits) {
  std::vector<int32_t> out;
  Tensor step = d.forward(prompt);
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(step.device().is_cpu()) << "decoder logits come back on the host";
    const std::vector<float> row = step.to_vector();
    logits->insert(logits->end(), row.begin(), row.end());
    out.push_back(static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin()));
    if (i + 1 < n) step = d.forward(std::span<const int32_t>(&out.back(), 1));
  }
  return out;
}

// (3) the serving path: greedy tokens of host's and dev's decoders for prompt (the same tokens,
// the logits within tol), then one decode_batch step of two sequences (continuous batching).
inline void expect_decoding_as_host(models::IncrementalDecoder& host,
                                    models::IncrementalDecoder& dev,
                                    std::span<const int32_t> prompt, int n, double tol) {
  std::vector<float> want, got;
  const std::vector<int32_t> tokens = greedy_tokens(host, prompt, n, &want);
  EXPECT_EQ(greedy_tokens(dev, prompt, n, &got), tokens) << "greedy tokens";
  expect_close(got, want, tol, "greedy steps' logits");
  double worst = rel_err(got, want);
  auto h2 = host.fresh(), d2 = dev.fresh();
  h2->forward(prompt.first(prompt.size() - 1));
  d2->forward(prompt.first(prompt.size() - 1));
  std::vector<models::IncrementalDecoder*> hs{&host, h2.get()}, ds{&dev, d2.get()};
  const std::vector<int32_t> ids{tokens.back(), prompt.back()};
  const Tensor rows = dev.decode_batch(ds, ids);
  EXPECT_TRUE(rows.device().is_cpu());
  got = rows.to_vector();
  want = host.decode_batch(hs, ids).to_vector();
  expect_close(got, want, tol, "decode_batch logits");
  worst = std::max(worst, rel_err(got, want));
  std::printf("on the device: decoder logits within %.2e of the host's\n", worst);
}

}  // namespace ds::testing
