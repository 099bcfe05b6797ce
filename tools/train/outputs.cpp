#include "outputs.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ds/core/error.h"

namespace ds::train {

void write_memory_json(const std::filesystem::path& file, const runtime::MemoryBudget& mem,
                       int rank, int world_size, int64_t activations_estimate,
                       int64_t peak_tensor_bytes, int64_t peak_rss_bytes) {
  const nlohmann::ordered_json j = {{"rank", rank},
                                    {"world_size", world_size},
                                    {"params_bytes", mem.params},
                                    {"grads_bytes", mem.grads},
                                    {"master_weights_bytes", mem.master_weights},
                                    {"optimizer_states_bytes", mem.optimizer_states},
                                    {"activations_estimate_bytes", activations_estimate},
                                    {"peak_tensor_bytes", peak_tensor_bytes},
                                    {"peak_rss_bytes", peak_rss_bytes}};
  std::ofstream out(file, std::ios::trunc);
  DS_CHECK(out.good(), "[ds_train] cannot write '{}'", file.string());
  out << j.dump(2) << "\n";
}

void write_loss_chart(const std::filesystem::path& svg, const runtime::CsvMonitor& monitor,
                      int64_t global_batch, int64_t seq_len, const std::string& title,
                      double unigram_entropy, double eval_baseline) {
  using Points = std::vector<std::pair<double, double>>;
  auto to_steps = [&](const std::vector<std::pair<int64_t, double>>& rows) {
    Points pts;
    for (const auto& [s, v] : rows)
      pts.emplace_back(static_cast<double>(s) / static_cast<double>(global_batch), v);
    return pts;
  };
  runtime::ChartSpec chart;
  chart.title = title;
  chart.x_label =
      fmt::format("optimizer step ({} samples of {} tokens each)", global_batch, seq_len);
  chart.y_label = "cross-entropy loss (nats/token)";
  // Per-step losses are noisy: draw them light, with a centred moving average on top.
  const Points train =
      to_steps(runtime::CsvMonitor::read(monitor.file_of("Train/Samples/train_loss")));
  const int64_t n = static_cast<int64_t>(train.size());
  const int64_t w = std::max<int64_t>(1, n / 40);
  Points smooth;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t lo = std::max<int64_t>(0, i - w), hi = std::min<int64_t>(n - 1, i + w);
    double sum = 0.0;
    for (int64_t k = lo; k <= hi; ++k) sum += train[static_cast<size_t>(k)].second;
    smooth.emplace_back(train[static_cast<size_t>(i)].first,
                        sum / static_cast<double>(hi - lo + 1));
  }
  chart.series.push_back({"train loss (per step)", "#aecde8", train});
  if (w > 1)
    chart.series.push_back(
        {fmt::format("train loss (mean of {} steps)", 2 * w + 1), "#1f4e99", smooth});
  const Points eval =
      to_steps(runtime::CsvMonitor::read(monitor.file_of("Eval/Samples/eval_loss")));
  if (!eval.empty()) chart.series.push_back({"eval loss", "#d62728", eval, /*markers=*/true});
  chart.lines.push_back(
      {fmt::format("train unigram entropy {:.2f}", unigram_entropy), unigram_entropy, "#1f4e99"});
  if (!eval.empty() && std::isfinite(eval_baseline))
    chart.lines.push_back({fmt::format("eval: train unigram frequencies {:.2f}", eval_baseline),
                           eval_baseline, "#d62728"});
  runtime::write_svg_chart(svg, chart);
}

std::string generate_sample(models::GPT& model, const data::Tokenizer& tok,
                            const std::string& prompt, int64_t max_tokens, int64_t top_k,
                            uint64_t seed) {
  std::vector<int32_t> p = tok.encode(prompt);
  p.insert(p.begin(), tok.eot_id());
  // A prompt longer than the context keeps its end.
  const int64_t keep = std::min<int64_t>(static_cast<int64_t>(p.size()), model.config().block_size);
  const std::vector<int64_t> ids(p.end() - keep, p.end());
  const Tensor out = model.generate(Tensor::from_ints(ids, {1, keep}), max_tokens, top_k, seed);
  const std::vector<int64_t> all = out.to_int_vector();
  const std::vector<int32_t> generated(all.begin() + keep, all.end());
  return prompt + tok.decode(generated);
}

}  // namespace ds::train
