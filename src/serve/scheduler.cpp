// Continuous batching (scheduler.h).
#include "ds/serve/scheduler.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "ds/core/error.h"
#include "ds/core/parallel.h"

namespace ds::serve {

using Clock = std::chrono::steady_clock;

struct Scheduler::Entry {
  GenerationRequest req;
  std::promise<GenerationResult> done;
  std::optional<Sequence> seq;                      // from admission on
  std::unique_ptr<models::IncrementalDecoder> dec;  // while in the batch
  Clock::time_point submitted = Clock::now();
  double queue_seconds = 0.0;

  bool gave_up() const { return req.cancelled && req.cancelled(); }
  // The end of a request that never ran (cancelled while waiting, or a bad request).
  void end_unstarted(std::exception_ptr error = nullptr) {
    if (error) {
      done.set_exception(error);
    } else {
      GenerationResult r;
      r.prompt_tokens = static_cast<int64_t>(req.prompt.size());
      r.finish_reason = "cancelled";
      r.queue_seconds = std::chrono::duration<double>(Clock::now() - submitted).count();
      done.set_value(std::move(r));
    }
    if (req.on_finish) req.on_finish();
  }
};

Scheduler::Scheduler(std::unique_ptr<models::IncrementalDecoder> prototype,
                     const TextTokenizer& tokenizer, SchedulerOptions options)
    : prototype_(std::move(prototype)), tokenizer_(tokenizer), opt_(std::move(options)) {
  DS_CHECK(prototype_ != nullptr, "[serve] the scheduler needs a decoder");
  DS_CHECK(opt_.max_batch >= 1, "[serve] max_batch must be at least 1, got {}", opt_.max_batch);
  // The compute thread count is an OpenMP setting of each thread: the creator's holds for ours.
  thread_ = std::thread([this, threads = num_threads()] {
    limit_this_thread(threads);
    loop();
  });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::future<GenerationResult> Scheduler::submit(GenerationRequest request) {
  auto e = std::make_shared<Entry>();
  e->req = std::move(request);
  std::future<GenerationResult> f = e->done.get_future();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) {
      e->end_unstarted();
      return f;
    }
    waiting_.push_back(std::move(e));
  }
  cv_.notify_all();
  return f;
}

int Scheduler::waiting() const {
  std::lock_guard<std::mutex> lk(mu_);
  return static_cast<int>(waiting_.size());
}

void Scheduler::retire(Entry& e) {
  GenerationResult r = std::move(e.seq->result());
  r.queue_seconds = e.queue_seconds;
  if (e.dec) {
    free_.push_back(std::move(e.dec));
    --running_;
  }
  e.done.set_value(std::move(r));
  if (e.req.on_finish) e.req.on_finish();
}

void Scheduler::loop() {
  std::vector<std::shared_ptr<Entry>> batch;  // running sequences, in admission order
  for (;;) {
    std::vector<std::shared_ptr<Entry>> queued;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !waiting_.empty() || !batch.empty(); });
      if (stop_) break;
      queued.assign(waiting_.begin(), waiting_.end());
    }
    // Waiting requests that gave up leave the queue now, not when their turn comes. The checks
    // may poll sockets: not under the lock.
    for (auto& e : queued) {
      if (!e->gave_up()) continue;
      {
        std::lock_guard<std::mutex> lk(mu_);
        waiting_.erase(std::find(waiting_.begin(), waiting_.end(), e));
      }
      e->end_unstarted();
    }
    step(batch);
  }
  for (auto& e : batch) {
    e->seq->cancel();
    retire(*e);
  }
  std::deque<std::shared_ptr<Entry>> left;
  {
    std::lock_guard<std::mutex> lk(mu_);
    left.swap(waiting_);
  }
  for (auto& e : left) e->end_unstarted();
}

void Scheduler::step(std::vector<std::shared_ptr<Entry>>& batch) {
  // Admission, in arrival order, while there is room.
  std::vector<std::shared_ptr<Entry>> admitted;
  {
    std::lock_guard<std::mutex> lk(mu_);
    while (!waiting_.empty() && static_cast<int>(batch.size() + admitted.size()) < opt_.max_batch) {
      admitted.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
    }
  }
  const ContextBudget context = ContextBudget::of(*prototype_);
  for (auto& e : admitted) {
    e->queue_seconds = std::chrono::duration<double>(Clock::now() - e->submitted).count();
    try {
      e->seq.emplace(tokenizer_, e->req.prompt, e->req.params, e->req.eos_ids, e->req.on_text,
                     context);
      if (e->req.processor) e->seq->set_logits_processor(e->req.processor);
    } catch (...) {
      e->end_unstarted(std::current_exception());
      continue;
    }
    if (e->gave_up()) {
      e->seq->cancel();
      retire(*e);
      continue;
    }
    if (free_.empty()) {
      e->dec = prototype_->fresh();
    } else {
      e->dec = std::move(free_.back());
      free_.pop_back();
    }
    ++running_;
    try {  // the prefill: alone, on the GEMM path, exactly as generate() runs it
      e->dec->reset();
      std::vector<float> row = e->dec->forward(e->req.prompt).to_vector();
      e->seq->prefilled();
      if (e->seq->advance(row)) {
        batch.push_back(e);
        continue;
      }
    } catch (...) {
      free_.push_back(std::move(e->dec));
      --running_;
      e->end_unstarted(std::current_exception());
      continue;
    }
    retire(*e);
  }
  // Running sequences whose client left retire before the step.
  std::erase_if(batch, [&](const std::shared_ptr<Entry>& e) {
    if (!e->gave_up()) return false;
    e->seq->cancel();
    retire(*e);
    return true;
  });
  if (batch.empty()) return;

  // One decode step for all: (B, V) logits, row b for batch[b].
  std::vector<models::IncrementalDecoder*> decs;
  std::vector<int32_t> ids;
  for (auto& e : batch) {
    decs.push_back(e->dec.get());
    ids.push_back(e->seq->next_token());
  }
  Tensor logits;
  try {
    logits = decs[0]->decode_batch(decs, ids);
  } catch (...) {
    const std::exception_ptr error = std::current_exception();
    for (auto& e : batch) {
      free_.push_back(std::move(e->dec));
      --running_;
      e->end_unstarted(error);
    }
    batch.clear();
    return;
  }
  ++steps_;
  if (opt_.on_step) opt_.on_step(static_cast<int>(batch.size()));
  const int64_t V = logits.size(1);
  float* rows = logits.data<float>();
  for (size_t b = 0; b < batch.size(); ++b) {
    Entry& e = *batch[b];
    if (!e.seq->advance(
            std::span<float>(rows + static_cast<int64_t>(b) * V, static_cast<size_t>(V)))) {
      retire(e);
      batch[b] = nullptr;
    }
  }
  std::erase(batch, nullptr);
}

}  // namespace ds::serve
