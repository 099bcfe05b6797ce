#pragma once
// Continuous batching: one thread owns the model and advances every running generation by one
// token per step, in one batched decode forward (models::IncrementalDecoder::decode_batch), as
// vLLM, TGI and llama.cpp's server do. On a CPU decode is bound by reading the weights; a step of B
// sequences reads them once, so B requests progress at nearly the speed of one.
//
//   serve::Scheduler sched(model, tokenizer, {.max_batch = 8});
//   auto done = sched.submit({.prompt = ids, .params = p, .eos_ids = eos, .on_text = cb});
//   GenerationResult r = done.get();  // as generate() would have returned it alone
//
// Each step: requests that gave up (cancelled) leave; waiting requests are admitted in arrival
// order while fewer than max_batch run, each prefilled alone (one GEMM-path forward) and sampled
// for its first token; then one decode_batch over every running sequence, each sampled with its
// own params and seed; finished and cancelled sequences retire at once and their places go to the
// next waiting requests at the next step. A request's tokens equal those of generate() alone (same
// prefill, decode rows equal bit for bit, the same sampler draws), whatever else shares its steps.
//
// Encoder-decoders (models::Seq2SeqDecoder) run the same way: the prefill encodes the prompt as
// the source and runs the decoder start token; the budget a request is checked against is the
// decoder's (ContextBudget::of: the source limit and the target's positions).
//
// Memory: one KV cache per running sequence (IncrementalDecoder::cache_bytes, up to block_size
// positions each), kept for reuse: at most max_batch caches.
//
// Threading: submit(), running(), waiting() and decode_steps() may be called from any thread. A
// request's on_text, cancelled and on_finish run on the scheduler's thread, between steps: they
// must be quick and must not block (ds_serve hands text to the connection's thread).
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "ds/models/gpt.h"
#include "ds/models/incremental_decoder.h"
#include "ds/serve/generate.h"
#include "ds/serve/text_tokenizer.h"

namespace ds::serve {

struct SchedulerOptions {
  int max_batch = 8;  // sequences in one decode step; 1 = one generation at a time
  // Called after each batched decode step with its number of sequences (metrics).
  std::function<void(int batch)> on_step;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams params;
  std::vector<int32_t> eos_ids;
  TextCallback on_text;             // final text as it comes (generate()'s on_text)
  CancelCheck cancelled;            // asked every step, waiting or running: true ends the request
  std::function<void()> on_finish;  // after the result is ready (wakes a waiting thread)
  LogitsProcessor processor;        // each step's logits before sampling (Sequence); may be empty
};

class Scheduler {
 public:
  // The model and tokenizer must outlive the scheduler.
  // prototype: a decoder of the model to serve (models::make_decoder(model), from the family
  // registry); each admitted sequence gets prototype->fresh() (reused after it retires).
  Scheduler(std::unique_ptr<models::IncrementalDecoder> prototype, const TextTokenizer& tokenizer,
            SchedulerOptions options = {});
  // Cancels what is waiting or running (their results: finish_reason "cancelled") and joins.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request behind every earlier one. The future holds the result ("cancelled" when
  // cancelled first) or the exception of a bad request ("[generate] ..." from Sequence).
  std::future<GenerationResult> submit(GenerationRequest request);

  int running() const { return running_.load(); }  // sequences in the batch
  int waiting() const;                             // submitted, not yet admitted
  int max_batch() const { return opt_.max_batch; }
  uint64_t decode_steps() const { return steps_.load(); }  // batched decode forwards so far

 private:
  struct Entry;
  void loop();
  void step(std::vector<std::shared_ptr<Entry>>& batch);
  void retire(Entry& e);

  // Makes each sequence's decoder (fresh()); never runs itself.
  std::unique_ptr<models::IncrementalDecoder> prototype_;
  const TextTokenizer& tokenizer_;
  SchedulerOptions opt_;
  std::vector<std::unique_ptr<models::IncrementalDecoder>>
      free_;  // caches of retired sequences, for reuse
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Entry>> waiting_;  // arrival order
  bool stop_ = false;
  std::atomic<int> running_{0};
  std::atomic<uint64_t> steps_{0};
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace ds::serve
