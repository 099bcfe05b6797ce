#include "ds/train/outputs.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ds/comm/group.h"
#include "ds/core/error.h"
#include "ds/core/file_io.h"
#include "ds/data/chat_template.h"
#include "ds/data/text_tokenizer.h"
#include "ds/data/tokenizer_export.h"

namespace ds::train {

std::vector<RankMemory> gather_memory(runtime::Engine& engine, const RankMemory& mine) {
  constexpr size_t kFields = 7;
  const int64_t row[kFields] = {
      mine.mem.params,  mine.mem.grads,         mine.mem.master_weights, mine.mem.optimizer_states,
      mine.mem.scratch, mine.peak_tensor_bytes, mine.peak_rss_bytes};
  // Every rank of the job (with tensor or pipeline parallelism more than the engine's data group).
  (void)engine;
  auto world = comm::world();
  const int n = world->size();
  std::vector<int64_t> all(kFields * static_cast<size_t>(n));
  world->all_gather(row, all.data(), kFields, DType::i64, "memory report");
  std::vector<RankMemory> out(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const int64_t* v = all.data() + kFields * static_cast<size_t>(r);
    auto& e = out[static_cast<size_t>(r)];
    e.rank = r;
    e.mem.params = v[0];
    e.mem.grads = v[1];
    e.mem.master_weights = v[2];
    e.mem.optimizer_states = v[3];
    e.mem.scratch = v[4];
    e.peak_tensor_bytes = v[5];
    e.peak_rss_bytes = v[6];
  }
  return out;
}

zero::ModelStateBytes paper_model_state_bytes(runtime::Engine& engine) {
  zero::ModelStateBytes b = zero::expected_model_state_bytes(
      engine.zero_stage(), engine.partition_plan(), engine.training_dtype(), engine.grad_dtype(),
      engine.optimizer().state_floats_per_param());
  // The formulas cover the trainable parameters (the partition plan's); frozen ones (LoRA's
  // base) are whole on every rank in the training dtype, with nothing else.
  const nn::FlatParameters& frozen = engine.strategy().frozen();
  if (frozen.params.defined()) b.params += static_cast<int64_t>(frozen.params.nbytes());
  return b;
}

namespace {
std::string mib(int64_t b) {
  return fmt::format("{:.1f} MiB", static_cast<double>(b) / 1048576.0);
}
}  // namespace

void print_memory_table(const std::vector<RankMemory>& ranks, const zero::ModelStateBytes& paper,
                        const std::function<void(const std::string&)>& out) {
  out(fmt::format("  {:<6} {:>12} {:>12} {:>12} {:>12} {:>12}", "rank", "params", "grads", "master",
                  "optimizer", "total"));
  for (const auto& r : ranks)
    out(fmt::format("  {:<6} {:>12} {:>12} {:>12} {:>12} {:>12}", r.rank, mib(r.mem.params),
                    mib(r.mem.grads), mib(r.mem.master_weights), mib(r.mem.optimizer_states),
                    mib(r.mem.total())));
  out(fmt::format("  {:<6} {:>12} {:>12} {:>12} {:>12} {:>12}", "paper", mib(paper.params),
                  mib(paper.grads), mib(paper.master_weights), mib(paper.optimizer_states),
                  mib(paper.total())));
}

void write_memory_json(const std::filesystem::path& file, runtime::Engine& engine,
                       const std::vector<RankMemory>& ranks, int64_t activations_estimate) {
  const zero::ModelStateBytes paper = paper_model_state_bytes(engine);
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const auto& r : ranks)
    rows.push_back({{"rank", r.rank},
                    {"params_bytes", r.mem.params},
                    {"grads_bytes", r.mem.grads},
                    {"master_weights_bytes", r.mem.master_weights},
                    {"optimizer_states_bytes", r.mem.optimizer_states},
                    {"model_state_bytes", r.mem.total()},
                    {"gradient_scratch_bytes", r.mem.scratch},
                    {"peak_tensor_bytes", r.peak_tensor_bytes},
                    {"peak_rss_bytes", r.peak_rss_bytes}});
  const nlohmann::ordered_json j = {{"world_size", engine.world_size()},
                                    {"zero_stage", engine.zero_stage()},
                                    {"params_dtype", dtype_name(engine.training_dtype())},
                                    {"grads_dtype", dtype_name(engine.grad_dtype())},
                                    {"activations_estimate_bytes", activations_estimate},
                                    {"paper_model_state_bytes_per_rank",
                                     {{"params_bytes", paper.params},
                                      {"grads_bytes", paper.grads},
                                      {"master_weights_bytes", paper.master_weights},
                                      {"optimizer_states_bytes", paper.optimizer_states},
                                      {"model_state_bytes", paper.total()}}},
                                    {"ranks", rows}};
  // Temporary name, fsync, rename: a crash never leaves half a file, a failed write no temporary.
  write_file_atomic(file, j.dump(2) + "\n");
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

std::string export_tokenizer_beside(const std::filesystem::path& export_dir,
                                    const std::vector<std::filesystem::path>& sources,
                                    int64_t model_vocab_size) {
  namespace fs = std::filesystem;
  std::vector<std::string> why;
  for (const fs::path& src : sources) {
    std::error_code ec;
    if (src.empty() || !fs::is_directory(src, ec)) continue;
    std::unique_ptr<data::TextTokenizer> tok;
    try {
      tok = data::load_tokenizer(src);
    } catch (const Error& e) {
      why.push_back(fmt::format("{}: {}", src.string(), e.what()));
      continue;
    }
    if (tok->vocab_size() > model_vocab_size) {
      why.push_back(fmt::format("{}: its {} ids do not fit the model's vocab_size {}",
                                src.string(), tok->vocab_size(), model_vocab_size));
      continue;
    }
    data::export_tokenizer(*tok, export_dir);
    // The special-token ids of config.json (and generate()) are the tokenizer's.
    const fs::path cfg_file = export_dir / "config.json";
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(cfg_file));
    const data::TokenizerConfig& c = tok->config();
    for (auto [key, id] : {std::pair{"bos_token_id", c.bos_id}, std::pair{"eos_token_id", c.eos_id},
                           std::pair{"pad_token_id", c.pad_id}})
      if (id >= 0) cfg[key] = id;
    write_file_atomic(cfg_file, cfg.dump(2) + "\n");
    return fmt::format("tokenizer ({}, {} ids) from {} written beside the export",
                       tok->kind(), tok->vocab_size(), src.string());
  }
  return why.empty() ? std::string("no tokenizer files found: the export has none (give "
                                   "--tokenizer DIR)")
                     : fmt::format("no tokenizer exported ({})", fmt::join(why, "; "));
}

std::string sft_template_of(const std::filesystem::path& data_dir) {
  std::ifstream in(data_dir / "meta.json");
  if (!in) return "";
  const nlohmann::json meta = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!meta.is_object() || !meta.contains("sft") || !meta["sft"].is_object()) return "";
  return meta["sft"].value("template", std::string());
}

std::string set_export_chat_template(const std::filesystem::path& export_dir,
                                     const std::string& name) {
  const data::ChatTemplate t = data::ChatTemplate::by_name(name);
  const std::filesystem::path file = export_dir / "tokenizer_config.json";
  nlohmann::ordered_json cfg = nlohmann::ordered_json::object();
  if (std::ifstream in(file); in) cfg = nlohmann::ordered_json::parse(in);
  cfg["chat_template"] = std::string(t.jinja());
  write_file_atomic(file, cfg.dump(2) + "\n");
  return fmt::format("chat template \"{}\" (the SFT data's) written into {}", name, file.string());
}

}  // namespace ds::train
