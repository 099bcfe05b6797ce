#include "progress.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "ds/core/allocator.h"
#include "ds/core/device_registry.h"
#include "ds/train/train_util.h"

namespace ds::train {

void ProgressReport::on_step(const StepReport& r) {
  recent.push_back(r.loss);
  if (static_cast<int64_t>(recent.size()) > logging_steps) recent.pop_front();
  if (first_step_ < 0) first_step_ = r.step - 1;
  window_loss_ += r.loss, window_time_ += r.seconds, train_time_ += r.seconds, ++window_steps_;
  std::vector<runtime::MonitorEvent> ev = {
      {"Train/Samples/train_loss", r.loss, r.samples},
      {"Train/Samples/lr", r.lr, r.samples},
      {"Train/Samples/tokens_per_second", r.tokens_per_second, r.samples}};
  // As DeepSpeed's engine: the loss scale only when fp16 has one.
  if (trainer->plan().config().fp16.enabled)
    ev.push_back({"Train/Samples/loss_scale", r.loss_scale, r.samples});
  if (std::isfinite(r.grad_norm)) ev.push_back({"Train/Samples/grad_norm", r.grad_norm, r.samples});
  if (trainer->is_lead()) monitor->write_events(ev);
  if (first_step_ == r.step - 1) {
    const int64_t states = trainer->memory_budget().total();
    const Device dev = trainer->plan().device;
    if (dev.is_cpu()) {
      const int64_t peak = static_cast<int64_t>(cpu_allocator().stats().peak_bytes_in_use);
      message(
          fmt::format("step {}: measured peak tensor memory {} (model states {} + activations "
                      "and temporaries {}); RSS {}",
                      r.step, mib(peak), mib(states), mib(std::max<int64_t>(0, peak - states)),
                      mib(current_rss_bytes())));
    } else {
      // Model states split between the GPU (parameters, gradients) and host memory (master
      // weights, optimizer state); activations are on the GPU.
      const AllocatorStats g = device_ops(dev).allocator->stats();
      message(fmt::format(
          "step {}: measured peak tensor memory on {} {} (reserved {}), in host memory {} "
          "(model states {} in all); RSS {}",
          r.step, dev.str(), mib(static_cast<int64_t>(g.peak_bytes_in_use)),
          mib(static_cast<int64_t>(g.bytes_reserved)),
          mib(static_cast<int64_t>(cpu_allocator().stats().peak_bytes_in_use)), mib(states),
          mib(current_rss_bytes())));
    }
  }
  const double eta = train_time_ / static_cast<double>(r.step - first_step_) *
                     static_cast<double>(r.total_steps - r.step);
  con.bar(fmt::format("step {}/{} [{}] loss {:.4f} | lr {:.2e} | {} tok/s | ETA {}", r.step,
                      r.total_steps, bar_cells(double(r.step) / r.total_steps, 24), r.loss, r.lr,
                      human_count(r.tokens_per_second), human_duration(eta)));
  if (r.step % logging_steps == 0 || r.step == r.total_steps) {
    const double tokens = static_cast<double>(trainer->tokens_per_step() * window_steps_);
    message(fmt::format(
        "step {}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.3f} | {} tok/s | {:.2f}s/step | "
        "elapsed {} | ETA {}{}",
        r.step, r.total_steps, window_loss_ / window_steps_, r.lr, r.grad_norm,
        human_count(tokens / window_time_), window_time_ / window_steps_,
        human_duration(seconds_since(t_start)), human_duration(eta),
        r.skipped_steps > 0 ? fmt::format(" | skipped {}", r.skipped_steps) : ""));
    window_loss_ = window_time_ = 0.0;
    window_steps_ = 0;
  }
}
void ProgressReport::on_eval(const EvalReport& r) {
  const double ppl = std::exp(r.loss);
  if (trainer->is_lead())
    monitor->write_events({{"Eval/Samples/eval_loss", r.loss, r.samples},
                           {"Eval/Samples/eval_perplexity", ppl, r.samples}});
  message(fmt::format("step {}: eval loss {:.4f}, perplexity {:.2f} ({:.1f}s)", r.step, r.loss, ppl,
                      r.seconds));
}
void ProgressReport::on_save(const SaveReport& r) {
  std::string deleted;
  for (const auto& p : r.deleted) deleted += " " + p.filename().string();
  message(fmt::format("step {}: checkpoint {}/global_step{} ({:.1f}s){}", r.step, r.dir.string(),
                      r.step, r.seconds, deleted.empty() ? "" : "; deleted" + deleted));
}
}  // namespace ds::train
