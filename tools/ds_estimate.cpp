// ds_estimate: DeepSpeed's ZeRO memory estimator tables, from a parameter count or from a model.
//
//   ds_estimate --stage 3 --params 2783959040 --largest_layer 65798144
//   ds_estimate --stage 2 --model gpt2-xl --num_gpus 1 --num_nodes 1
//   ds_estimate --stage 3 --model out/hf_model          (an HF folder with config.json)
//   ds_estimate --stage 3 --model t0_3b_folder          (encoder-decoders: bart, blenderbot, t5)
//   ds_estimate --stage 3 --model mixtral_folder        (+ a line with total and active params)
//   ds_estimate --stage 3 --model gpt2-xl --nvme_path /local_nvme   (+ NVMe offload rows)
//
// The tables are DeepSpeed's estimate_zero{2,3}_model_states_mem_needs_all_cold output byte for
// byte (zero/estimate.h). With --model the counts are taken the way the _all_live variants do
// (tied weights once; the largest module's own parameters), from a model built without memory.
// --nvme_path adds deepspeed.cpp's own NVMe offload rows (RAM, disk with and without a checkpoint,
// bytes moved per step) with the I/O time per step from a short disk probe in that folder.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "ds/core/error.h"
#include "ds/io/aio.h"
#include "ds/models/gpt.h"
#include "ds/models/hf_io.h"
#include "ds/models/seq2seq.h"
#include "ds/models/recorded_model.h"
#include "ds/models/seq2seq_io.h"
#include "ds/nn/module.h"
#include "ds/zero/estimate.h"

namespace {

// The most parameters the tables take (--params or a --model's count).
constexpr int64_t kMaxParams = int64_t{1} << 50;

ds::models::GPTConfig resolve_model(const std::string& name) {
  return ds::models::resolve_model_config(name, "ds_estimate");
}

// The line under the table for a mixture of experts: the table's count is the total (every
// expert is held, trained and sharded); a token runs only experts_per_tok of them.
std::string describe_experts(const ds::models::GPTConfig& cfg) {
  return fmt::format(
      "Mixture of experts: {} total params (the memory above), {} active per token ({} of {} "
      "experts per layer)\n",
      cfg.num_parameters(), cfg.num_active_parameters(), cfg.experts_per_tok, cfg.num_experts);
}

// The count from Seq2SeqConfig's shapes, the largest layer from a one-layer model of the same
// shapes.
ds::zero::ParameterCounts count_seq2seq(const std::string& model, ds::models::Seq2SeqConfig s2s) {
  ds::zero::ParameterCounts c;
  c.params = s2s.num_parameters();
  DS_CHECK(c.params <= kMaxParams,
           "[ds_estimate] --model {} describes {:.3g} parameters, more than the {:.3g} this "
           "estimator takes; check the config's sizes",
           model, static_cast<double>(c.params), static_cast<double>(kMaxParams));
  s2s.encoder_layers = s2s.decoder_layers = 1;
  ds::nn::PartitionedInit no_memory;  // shapes only: nothing is allocated
  ds::models::Seq2Seq m(s2s, /*init=*/false);
  c.largest_layer = ds::zero::count_parameters(m).largest_layer;
  return c;
}

// The count comes from the config's shapes (128-bit, so a config.json of 1e9 layers or
// hidden_size 2^40 is a number or a clear error, not a wrapped one); the largest layer from a
// one-block model of the same shapes (every block is alike), so that no config, however deep,
// builds millions of modules. A mixture of experts sets `moe_note` (describe_experts).
ds::zero::ParameterCounts count_decoder(const std::string& model,
                                        std::optional<std::string>& moe_note) {
  ds::models::GPTConfig cfg = resolve_model(model);
  ds::zero::ParameterCounts c;
  c.params = cfg.num_parameters();
  if (cfg.num_experts > 0) moe_note = describe_experts(cfg);
  // The tables' byte counts are 64-bit integers: past --params' bound they would wrap.
  DS_CHECK(c.params <= kMaxParams,
           "[ds_estimate] --model {} describes {:.3g} parameters (n_layer {}, n_embd {}, ffn "
           "{}, vocab_size {}, block_size {}), more than the {:.3g} this estimator takes; "
           "check the config's sizes",
           model, static_cast<double>(c.params), cfg.n_layer, cfg.n_embd, cfg.resolved_ffn_hidden(),
           cfg.vocab_size, cfg.block_size, static_cast<double>(kMaxParams));
  // The model is built with one block and a block_size of 1 (its position ids are a real
  // buffer of block_size values; GPT-2's wpe, block_size x n_embd, is counted here instead).
  const int64_t wpe = cfg.layout == ds::nn::Layout::gpt2 ? cfg.block_size * cfg.n_embd : 0;
  // A block's experts are one module (its stacked gate_up_proj and down_proj: E x 3 x I x C);
  // PartitionedInit still allocates each parameter once, so they are counted, not built.
  const int64_t experts = cfg.num_experts * 3 * cfg.resolved_moe_ffn_hidden() * cfg.n_embd;
  cfg.n_layer = std::min<int64_t>(cfg.n_layer, 1);
  cfg.mlp_only_layers.clear();  // the one block is a mixture of experts (when there are any)
  cfg.decoder_sparse_step = 1;
  cfg.block_size = 1;
  if (cfg.num_experts > 0) {  // experts of width 1 (a family may tie it to ffn_hidden)
    cfg.ffn_hidden = 1;
    if (cfg.moe_ffn_hidden > 0) cfg.moe_ffn_hidden = 1;
  }
  ds::nn::PartitionedInit no_memory;  // shapes only: nothing is allocated
  ds::models::GPT gpt(cfg, /*init=*/false);
  c.largest_layer = std::max({ds::zero::count_parameters(gpt).largest_layer, wpe, experts});
  return c;
}

}  // namespace

bool bw_direct = false;

// Sequential write then read of a temporary file in `dir` through the aio engine (O_DIRECT when the
// filesystem has it, 1 MiB blocks, queue depth 8), about seconds/2 each: (read, write) bytes/s.
std::pair<double, double> probe_disk(const std::string& dir, double seconds) {
  using Clock = std::chrono::steady_clock;
  bw_direct = ds::io::direct_io_supported(dir);
  const std::string path = dir + "/.ds_estimate_probe." + std::to_string(::getpid());
  ds::io::AioOptions o;
  auto engine = ds::io::make_engine(o);
  constexpr int64_t kChunk = 64 << 20;
  ds::io::AlignedBuffer buf(kChunk);
  std::fill(buf.as<char>(), buf.as<char>() + kChunk, 'x');
  int64_t written = 0, read = 0;
  double wt = 0, rt = 0;
  try {
    ds::io::File f =
        ds::io::File::open(path, ds::io::File::kReadWrite | ds::io::File::kCreate, bw_direct);
    const auto t0 = Clock::now();
    while ((wt = std::chrono::duration<double>(Clock::now() - t0).count()) < seconds / 2) {
      engine->wait(engine->write(f, buf.data(), kChunk, written));
      written += kChunk;
    }
    ::fsync(f.fd());
    wt = std::chrono::duration<double>(Clock::now() - t0).count();
    const auto t1 = Clock::now();
    while (read < written &&
           (rt = std::chrono::duration<double>(Clock::now() - t1).count()) < seconds / 2) {
      engine->wait(engine->read(f, buf.data(), kChunk, read));
      read += kChunk;
    }
    rt = std::chrono::duration<double>(Clock::now() - t1).count();
  } catch (...) {
    ::unlink(path.c_str());
    throw;
  }
  ::unlink(path.c_str());
  return {read / std::max(rt, 1e-9), written / std::max(wt, 1e-9)};
}

int main(int argc, char** argv) {
  CLI::App app{
      "DeepSpeed's ZeRO memory estimator: model-state memory per CPU node and per accelerator for "
      "each offload option, as estimate_zero2/3_model_states_mem_needs_all_cold prints it.",
      "ds_estimate"};
  int stage = 3;
  int64_t params = 0, largest_layer = 0;
  std::string model;
  int gpus = 1, nodes = 1;
  double abf = 1.5;
  app.add_option("--stage", stage, "ZeRO stage of the table: 2 or 3")
      ->capture_default_str()
      ->check(CLI::IsMember({2, 3}));
  auto* p_opt = app.add_option("--params", params, "Total parameters (tied weights once)")
                    ->check(CLI::Range(int64_t{1}, kMaxParams));
  app.add_option("--largest_layer", largest_layer,
                 "Parameters of the largest layer (stage 3; default: from --model, else 0)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 50));
  auto* m_opt = app.add_option("--model", model,
                               "A preset (gpt2, gpt2-xl, llama-tiny, ...), a model JSON file or an "
                               "HF folder with config.json: counts its parameters");
  p_opt->excludes(m_opt);
  app.add_option("--num_gpus", gpus, "Accelerators (processes) per node")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--num_nodes", nodes, "Nodes")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--additional_buffer_factor", abf, "DeepSpeed's factor on the CPU column")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 100.0));
  std::string nvme_path;
  double probe_seconds = 2.0;
  int64_t sub_group_size = 100000000;
  app.add_option("--nvme_path", nvme_path,
                 "Also print deepspeed.cpp's NVMe offload rows, timing a step's I/O with a disk "
                 "probe in this folder");
  app.add_option("--probe_seconds", probe_seconds, "Seconds of the disk probe (0: no probe)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 60.0));
  app.add_option("--sub_group_size", sub_group_size,
                 "zero_optimization.sub_group_size for the NVMe rows (DeepSpeed's default 1e9 "
                 "makes a 48 GB swap ring; deepspeed.cpp clamps it to a quarter of free RAM)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 50));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    DS_CHECK(params > 0 || !model.empty(), "[ds_estimate] give --params or --model");
    // An encoder-decoder folder (config.json with model_type bart / blenderbot / t5) or a decoder
    // (a preset, a model JSON, an HF folder): counted from its config's shapes.
    std::optional<std::string> moe_note;  // a mixture of experts: its active parameters
    const ds::models::Family* family = !model.empty() && std::filesystem::is_directory(model)
                                           ? ds::models::hf_folder_family(model)
                                           : nullptr;
    std::optional<ds::models::Seq2SeqConfig> s2s;
    if (family && family->kind == ds::models::ModelKind::seq2seq)
      s2s = ds::models::read_hf_seq2seq_config(model);
    if (!model.empty()) {
      const ds::zero::ParameterCounts c =
          s2s ? count_seq2seq(model, *s2s) : count_decoder(model, moe_note);
      params = c.params;
      if (largest_layer == 0) largest_layer = c.largest_layer;
    }
    std::fputs(stage == 2 ? ds::zero::zero2_table(params, gpus, nodes, abf).c_str()
                          : ds::zero::zero3_table(params, largest_layer, gpus, nodes, abf).c_str(),
               stdout);
    if (moe_note) std::fputs(moe_note->c_str(), stdout);
    if (!nvme_path.empty()) {
      double read_bps = 0, write_bps = 0;
      if (probe_seconds > 0) {
        const auto bw = probe_disk(nvme_path, probe_seconds);
        read_bps = bw.first;
        write_bps = bw.second;
        std::printf("\ndisk probe on %s (%.1f s, O_DIRECT %s): read %.2f GB/s, write %.2f GB/s\n",
                    nvme_path.c_str(), probe_seconds, bw_direct ? "on" : "off", read_bps / 1e9,
                    write_bps / 1e9);
      }
      std::printf("\n");
      std::fputs(ds::zero::nvme_table(stage, params, largest_layer, gpus, nodes, read_bps,
                                      write_bps, sub_group_size)
                     .c_str(),
                 stdout);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
