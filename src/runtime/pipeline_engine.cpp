#include "ds/runtime/pipeline_engine.h"

#include <chrono>
#include <string>

#include <nlohmann/json.hpp>

#include "ds/autograd/grad_mode.h"
#include "ds/core/error.h"
#include "ds/core/rng.h"

namespace ds::runtime {
namespace {

// Point-to-point tags on the pipeline group. MPI matches in order per (source, tag), so one tag
// per kind of message suffices: the schedule sends and receives each kind in micro-batch order.
constexpr int kActivationTag = 71;
constexpr int kGradTag = 72;
constexpr int kTiedGradTag = 73;
constexpr int kTiedWeightTag = 74;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

PipelineEngine::PipelineEngine(std::shared_ptr<nn::Module> stage, config::DeepSpeedConfig config,
                               InitOptions options)
    : module_(std::move(stage)), topology_(options.topology) {
  DS_CHECK(module_, "[pipeline] PipelineEngine needs this rank's stage module");
  stage_ = dynamic_cast<nn::PipelineStage*>(module_.get());
  DS_CHECK(stage_,
           "[pipeline] the model is not a pipeline stage (nn::PipelineStage); build this rank's "
           "part with models::GPT(config, tp, PipeRange)");
  DS_CHECK(topology_, "[pipeline] PipelineEngine needs InitOptions::topology (comm::Topology)");
  const int p = num_stages(), s = stage_id();
  DS_CHECK(stage_->is_first_stage() == (s == 0) && stage_->is_last_stage() == (s == p - 1),
           "[pipeline] rank {} is stage {} of {} but its module {} the embedding and {} the head; "
           "give stage s the layers partition_layers() assigns to s",
           topology_->rank(), s, p, stage_->is_first_stage() ? "holds" : "does not hold",
           stage_->is_last_stage() ? "holds" : "does not hold");
  DS_CHECK(config.pipeline.stages == 0 || config.pipeline.stages == p,
           "[pipeline] the config's pipeline.stages is {} but the job runs {} pipeline stages "
           "(--pipeline_parallel_size / the topology); make them agree or set \"auto\"",
           config.pipeline.stages, p);
  if (config.pipeline.activation_checkpoint_interval > 0)
    stage_->set_activation_checkpoint_interval(config.pipeline.activation_checkpoint_interval);
  act_dtype_ = config.training_dtype();
  hidden_ = stage_->hidden_size();
  if (const auto params = module_->named_parameters(); !params.empty())
    device_ = params.front().second.device();

  const bool last = stage_->is_last_stage();
  // A stage's input is the previous stage's activations (or the ids on the first stage); only the
  // last stage has labels and a loss.
  options.loss_fn = [last](nn::Module& m, const nn::Batch& b) {
    return last ? m.loss(b.input_ids, b.labels) : m(b.input_ids);
  };
  engine_ = std::make_unique<Engine>(module_, std::move(config), std::move(options));
  // The first stage sends the tied embedding to the last after every step: under ZeRO-3 it stays
  // gathered (as DeepSpeed's persistent parameters do).
  if (Tensor w = stage_->tied_embedding_weight(); w.defined() && p > 1)
    engine_->strategy().keep_gathered(w);

  // The stages agree on what they hold before anything travels between them.
  auto& pipe = *topology_->pipeline();
  const int64_t mine[4] = {stage_->tied_embedding_weight().defined() ? 1 : 0,
                           stage_->tied_head_weight().defined() ? 1 : 0, hidden_,
                           count_dropout_calls()};
  std::vector<int64_t> all(4 * static_cast<size_t>(p));
  pipe.all_gather(mine, all.data(), 4, DType::i64, "pipeline construction");
  DS_CHECK(all[0] == all[4 * (p - 1) + 1],
           "[pipeline] stage 0 {} a tied embedding but stage {} {} the tied head's copy; build "
           "every stage from the same model config",
           all[0] ? "has" : "has no", p - 1, all[4 * (p - 1) + 1] ? "has" : "has no");
  for (int k = 0; k < p; ++k) {
    if (k < s) dropout_prefix_ += all[4 * k + 3];
    dropout_total_ += all[4 * k + 3];
  }
  sync_tied_weight();
}

PipelineEngine::~PipelineEngine() = default;

int64_t PipelineEngine::count_dropout_calls() {
  autograd::NoGradGuard no_grad;
  const bool was_training = module_->is_training();
  module_->train(true);
  const rng::DropoutState saved = rng::dropout_state();
  const Tensor in = stage_->is_first_stage() ? Tensor::zeros({1, 1}, DType::i64, device_)
                                             : Tensor::zeros({1, 1, hidden_}, act_dtype_, device_);
  (void)(*module_)(in);
  const int64_t calls = static_cast<int64_t>(rng::dropout_state().offset - saved.offset);
  rng::dropout_state() = saved;
  module_->train(was_training);
  return calls;
}

void PipelineEngine::sync_tied_weight() {
  const int p = num_stages();
  if (p == 1) return;
  auto& pipe = *topology_->pipeline();
  if (Tensor w = stage_->tied_embedding_weight(); w.defined()) {
    // A ZeRO-3 step still running in the background (NVMe offload) has dropped the gathered copy:
    // gather the new values again (once its sub-group is written); a no-op when gathered.
    engine_->strategy().keep_gathered(w);
    pipe.send(w.detach().contiguous(), p - 1, kTiedWeightTag, "pipeline tied weight");
  } else if (Tensor h = stage_->tied_head_weight(); h.defined()) {
    Tensor buf = Tensor::empty(h.shape(), act_dtype_, device_);
    pipe.recv(buf, 0, kTiedWeightTag, "pipeline tied weight");
    h.detach().copy_from(buf);
  }
}

std::vector<PipeBatch> PipelineEngine::load(const std::function<PipeBatch()>& next, int count) {
  std::vector<PipeBatch> out;
  if (!stage_->is_first_stage() && !stage_->is_last_stage()) return out;
  DS_CHECK(next, "[pipeline] stage {} needs micro-batches: pass a next() function",
           stage_id());
  for (int i = 0; i < count; ++i) {
    out.push_back(next());
    // A decoder LM's batch only: another input would be dropped on the way through the stages.
    const nn::Batch& b = out.back().batch;
    DS_CHECK(!b.attention_mask.defined() && !b.token_type_ids.defined() &&
                 !b.decoder_input_ids.defined(),
             "[pipeline] micro-batch {}: a pipeline runs decoder LMs on input ids and labels only; "
             "the batch also has {}, which it would ignore",
             i,
             b.attention_mask.defined()   ? "attention_mask"
             : b.token_type_ids.defined() ? "token_type_ids"
                                          : "decoder_input_ids");
  }
  return out;
}

void PipelineEngine::agree_on_shapes(const std::vector<PipeBatch>& batches, int micro_batches,
                                     const char* what, const std::string& load_error) {
  const int p = num_stages();
  int64_t mine[6] = {-1, -1, hidden_, micro_batches, 0, static_cast<int64_t>(act_dtype_)};
  if (!load_error.empty()) {
    mine[4] = 2;  // next() threw here: every stage learns it below instead of waiting
  } else if (!batches.empty()) {
    const Tensor& ref = stage_->is_first_stage() ? batches[0].batch.input_ids : batches[0].batch.labels;
    for (const PipeBatch& b : batches) {
      const Tensor& t = stage_->is_first_stage() ? b.batch.input_ids : b.batch.labels;
      const bool ok = t.defined() && t.dim() == 2 && ref.defined() && t.shape() == ref.shape() &&
                      (!stage_->is_last_stage() || (b.batch.labels.defined() && b.batch.labels.dim() == 2)) &&
                      (!stage_->is_first_stage() || (b.batch.input_ids.defined() && b.batch.input_ids.dim() == 2));
      if (!ok) mine[4] = 1;
    }
    if (mine[4] == 0) {
      mine[0] = ref.size(0);
      mine[1] = ref.size(1);
    }
  }
  std::vector<int64_t> all(6 * static_cast<size_t>(p));
  topology_->pipeline()->all_gather(mine, all.data(), 6, DType::i64,
                                    std::string("pipeline ") + what + " shapes");
  auto at = [&](int stage, int field) { return all[static_cast<size_t>(6 * stage + field)]; };
  for (int k = 0; k < p; ++k) {
    if (at(k, 4) == 2) {
      if (k == stage_id())
        DS_THROW("[pipeline] {}: stage {} could not load its micro-batches: {}", what, k,
                 load_error);
      DS_THROW("[pipeline] {}: stage {} could not load its micro-batches (its own error names "
               "the cause)",
               what, k);
    }
  }
  for (int k = 0; k < p; ++k) {
    DS_CHECK(at(k, 4) == 0,
             "[pipeline] {}: the micro-batches given to stage {} are not all (B, T) int tensors of "
             "one shape (inputs on the first stage, targets on the last)",
             what, k);
    DS_CHECK(at(k, 3) == at(0, 3),
             "[pipeline] {}: stage 0 runs {} micro-batches but stage {} runs {}; every stage needs "
             "the same gradient_accumulation_steps",
             what, at(0, 3), k, at(k, 3));
    DS_CHECK(at(k, 5) == at(0, 5),
             "[pipeline] {}: stage 0 sends {} hidden states but stage {} trains in {}; every stage "
             "needs the same precision",
             what, dtype_name(static_cast<DType>(at(0, 5))), k,
             dtype_name(static_cast<DType>(at(k, 5))));
    if (k > 0)
      DS_CHECK(at(k, 2) == at(k - 1, 2),
               "[pipeline] {}: stage {} sends hidden states of size {} but stage {} expects {}; "
               "build every stage from the same model config",
               what, k - 1, at(k - 1, 2), k, at(k, 2));
  }
  DS_CHECK(at(0, 0) == at(p - 1, 0) && at(0, 1) == at(p - 1, 1),
           "[pipeline] {}: stage 0's inputs are ({}, {}) but stage {}'s targets are ({}, {}); the "
           "first and the last stage must be given the same micro-batches",
           what, at(0, 0), at(0, 1), p - 1, at(p - 1, 0), at(p - 1, 1));
  batch_ = at(0, 0);
  seq_ = at(0, 1);
}

Tensor PipelineEngine::new_activation() const {
  return Tensor::empty({batch_, seq_, hidden_}, act_dtype_, device_);
}

float PipelineEngine::aggregate_loss(double loss_sum, int micro_batches) {
  const int p = num_stages();
  float v = 0.0f;
  if (stage_->is_last_stage()) {
    v = static_cast<float>(loss_sum / micro_batches);
    auto& dp = *topology_->data_parallel();
    if (dp.size() > 1) {
      dp.all_reduce(&v, 1, DType::f32, comm::ReduceOp::sum, "pipeline loss");
      v /= static_cast<float>(dp.size());
    }
  }
  if (p > 1) topology_->pipeline()->broadcast(&v, 1, DType::f32, p - 1, "pipeline loss");
  return v;
}

// One train_batch's state: the micro-batches, their activations and gradients, the sends in
// flight, the loss so far and the dropout positions.
struct PipelineEngine::TrainState {
  int m = 0;
  std::string ctx;
  std::vector<PipeBatch> batches;
  std::vector<int64_t> sample_base;
  uint64_t offset0 = 0;
  std::vector<Tensor> in, out, grad_out;
  std::vector<comm::Work> act_sent, grad_sent;
  comm::Work tied_sent;
  double loss_sum = 0.0;
};

Tensor PipelineEngine::receive(TrainState& st, int from, int tag, const char* what) {
  Tensor a = new_activation();
  comm::Work w = topology_->pipeline()->recv_async(a, from, tag, st.ctx + " " + what);
  const auto t = Clock::now();
  w.wait();
  times_.wait_s += seconds_since(t);
  return a;
}

void PipelineEngine::train_forward(TrainState& st, int mb) {
  const int s = stage_id();
  const bool first = stage_->is_first_stage(), last = stage_->is_last_stage();
  const auto t = Clock::now();
  if (dropout_total_ > 0) {
    rng::dropout_state().offset =
        st.offset0 + static_cast<uint64_t>(mb * dropout_total_ + dropout_prefix_);
    rng::dropout_state().sample_base = static_cast<uint64_t>(st.sample_base[mb]);
  }
  const Tensor x = first ? st.batches[mb].batch.input_ids : st.in[mb];
  Tensor y = engine_->forward(x, last ? st.batches[mb].batch.labels : Tensor());
  if (last) {
    st.loss_sum += static_cast<double>(y.item());
  } else {
    DS_CHECK(y.dim() == 3 && y.size(0) == batch_ && y.size(1) == seq_ && y.size(2) == hidden_ &&
                 y.dtype() == act_dtype_,
             "[pipeline] internal: stage {} produced {} {} instead of ({}, {}, {}) {}", s,
             shape_str(y.shape()), dtype_name(y.dtype()), batch_, seq_, hidden_,
             dtype_name(act_dtype_));
  }
  st.out[mb] = y;
  times_.compute_s += seconds_since(t);
  // Sent as soon as it exists (DeepSpeed sends at its SendActivation one step later, because its
  // sends block): the next stage can start while this one receives.
  if (!last)
    st.act_sent[mb] = topology_->pipeline()->send_async(
        st.out[mb].detach().contiguous(), s + 1, kActivationTag, st.ctx + " activation");
}

void PipelineEngine::train_backward(TrainState& st, int mb) {
  const int p = num_stages(), s = stage_id();
  auto& pipe = *topology_->pipeline();
  const auto t = Clock::now();
  const bool final_backward = mb == st.m - 1;
  if (stage_->is_last_stage()) {
    engine_->backward(st.out[mb]);
    if (final_backward)
      if (Tensor h = stage_->tied_head_weight(); h.defined() && p > 1)
        st.tied_sent = pipe.send_async(h.grad().contiguous(), 0, kTiedGradTag,
                                       st.ctx + " tied weight gradient");
  } else {
    std::vector<Tensor> roots{st.out[mb]}, grads{st.grad_out[mb]};
    if (final_backward)
      if (Tensor w = stage_->tied_embedding_weight(); w.defined()) {
        // The last stage's gradient of the tied copy joins this backward as a second root.
        Tensor g = Tensor::empty(w.shape(), DType::f32, device_);
        times_.compute_s += seconds_since(t);
        const auto tw = Clock::now();
        pipe.recv(g, p - 1, kTiedGradTag, st.ctx + " tied weight gradient");
        times_.wait_s += seconds_since(tw);
        roots.push_back(w);
        grads.push_back(g.to(w.dtype()));
      }
    st.act_sent[mb].wait();  // its buffer is the output dropped below
    engine_->backward(roots, grads);
  }
  // Every micro-step but the last counts here; the last is the optimizer step.
  if (!final_backward) engine_->step();
  st.out[mb] = Tensor();
  st.grad_out[mb] = Tensor();
  times_.compute_s += seconds_since(t);
  if (s > 0)  // as soon as it exists, like the activations
    st.grad_sent[mb] =
        pipe.send_async(st.in[mb].grad().contiguous(), s - 1, kGradTag, st.ctx + " gradient");
}

void PipelineEngine::train_optimizer_step(TrainState& st) {
  auto wait_timed = [&](comm::Work& w) {
    const auto t = Clock::now();
    w.wait();
    times_.wait_s += seconds_since(t);
  };
  for (auto* works : {&st.act_sent, &st.grad_sent})
    for (comm::Work& w : *works) wait_timed(w);
  wait_timed(st.tied_sent);
  {  // the stages that finished early wait here for the rest: the end of the bubble
    const auto t = Clock::now();
    topology_->pipeline()->barrier(st.ctx + " end of schedule");
    times_.wait_s += seconds_since(t);
  }
  const auto t = Clock::now();
  engine_->step();
  sync_tied_weight();
  if (Tensor h = stage_->tied_head_weight(); h.defined() && h.grad().defined()) h.grad().zero_();
  times_.step_s += seconds_since(t);
}

float PipelineEngine::train_batch(const std::function<PipeBatch()>& next) {
  DS_CHECK(autograd::is_grad_enabled(),
           "[pipeline] train_batch() needs gradients enabled; use eval_batch() for evaluation");
  const auto t0 = Clock::now();
  times_ = {};
  TrainState st;
  st.m = static_cast<int>(engine_->config().batch.gradient_accumulation_steps);
  const int m = st.m, p = num_stages(), s = stage_id();
  std::string load_error;
  try {
    st.batches = load(next, m);
  } catch (const std::exception& e) {
    load_error = e.what();
  }
  agree_on_shapes(st.batches, m, "train_batch", load_error);
  st.ctx = fmt::format("step {} pipeline", engine_->global_steps() + 1);
  // Dropout: stage 0's sample positions, and each forward where the whole model's would be.
  st.sample_base.assign(static_cast<size_t>(m), 0);
  st.offset0 = rng::dropout_state().offset;
  if (dropout_total_ > 0) {
    if (stage_->is_first_stage())
      for (int k = 0; k < m; ++k) st.sample_base[k] = static_cast<int64_t>(st.batches[k].sample_base);
    if (p > 1)
      topology_->pipeline()->broadcast(st.sample_base.data(), st.sample_base.size(), DType::i64,
                                       0, st.ctx + " samples");
  }
  st.in.resize(m);
  st.out.resize(m);
  st.grad_out.resize(m);
  st.act_sent.resize(m);
  st.grad_sent.resize(m);
  for (const PipeStep& step : train_schedule(m, p, s))
    for (const PipeInstr& ins : step) {
      const int mb = ins.micro_batch;
      switch (ins.op) {
        case PipeOp::recv_activation:
          st.in[mb] = receive(st, s - 1, kActivationTag, "activation");
          st.in[mb].set_requires_grad(true);
          break;
        case PipeOp::forward: train_forward(st, mb); break;
        case PipeOp::recv_grad: st.grad_out[mb] = receive(st, s + 1, kGradTag, "gradient"); break;
        case PipeOp::backward: train_backward(st, mb); break;
        case PipeOp::optimizer_step: train_optimizer_step(st); break;
        case PipeOp::load_micro_batch:   // loaded before the schedule (agree_on_shapes)
        case PipeOp::send_activation:    // issued right after the forward
        case PipeOp::send_grad:          // issued right after the backward
        case PipeOp::reduce_tied_grads:  // the tied gradient joined the first stage's backward
        case PipeOp::reduce_grads:       // the strategy reduces in step()
          break;
      }
    }
  if (dropout_total_ > 0) rng::dropout_state().offset = st.offset0 + m * dropout_total_;
  const float loss = aggregate_loss(st.loss_sum, m);
  times_.total_s = seconds_since(t0);
  return loss;
}

float PipelineEngine::eval_batch(const std::function<PipeBatch()>& next, int micro_batches) {
  DS_CHECK(micro_batches >= 1, "[pipeline] eval_batch needs at least one micro-batch, got {}",
           micro_batches);
  const int m = micro_batches, p = num_stages(), s = stage_id();
  const bool first = stage_->is_first_stage(), last = stage_->is_last_stage();
  std::vector<PipeBatch> batches;
  std::string load_error;
  try {
    batches = load(next, m);
  } catch (const std::exception& e) {
    load_error = e.what();
  }
  agree_on_shapes(batches, m, "eval_batch", load_error);
  auto& pipe = *topology_->pipeline();
  const std::string ctx = fmt::format("eval after step {} pipeline", engine_->global_steps());
  std::vector<Tensor> in(m), out(m);  // out: kept until its send completed
  std::vector<comm::Work> sent(m);
  double loss_sum = 0.0;
  for (const PipeStep& step : inference_schedule(m, p, s)) {
    for (const PipeInstr& ins : step) {
      const int mb = ins.micro_batch;
      switch (ins.op) {
        case PipeOp::recv_activation:
          in[mb] = new_activation();
          pipe.recv(in[mb], s - 1, kActivationTag, ctx + " activation");
          break;
        case PipeOp::forward: {
          Tensor y = engine_->eval_loss(first ? batches[mb].batch.input_ids : in[mb],
                                        last ? batches[mb].batch.labels : Tensor());
          if (last) loss_sum += static_cast<double>(y.item());
          in[mb] = Tensor();
          out[mb] = y.contiguous();
          if (!last)
            sent[mb] = pipe.send_async(out[mb], s + 1, kActivationTag, ctx + " activation");
          break;
        }
        case PipeOp::send_activation:  // issued right after the forward
          break;
        default:
          break;
      }
    }
  }
  for (comm::Work& w : sent) w.wait();
  return aggregate_loss(loss_sum, m);
}

void PipelineEngine::save_checkpoint(const std::string& dir, const std::string& tag,
                                     const nlohmann::json& client_state) {
  engine_->save_checkpoint(dir, tag, client_state);
}

nlohmann::json PipelineEngine::load_checkpoint(const std::string& dir, const std::string& tag) {
  nlohmann::json client = engine_->load_checkpoint(dir, tag);
  sync_tied_weight();
  return client;
}

std::vector<std::pair<std::string, Tensor>> PipelineEngine::full_weights() {
  std::vector<std::pair<std::string, Tensor>> mine = engine_->full_weights();
  const int p = num_stages(), s = stage_id();
  if (p == 1) return mine;
  auto& pipe = *topology_->pipeline();
  const std::string ctx = "pipeline full_weights";
  if (s > 0) {
    // A header (names, dtypes, shapes) as JSON text, then each tensor's bytes.
    nlohmann::json head = nlohmann::json::array();
    for (const auto& [name, t] : mine)
      head.push_back({{"name", name}, {"dtype", static_cast<int>(t.dtype())}, {"shape", t.shape()}});
    std::string text = head.dump();
    int64_t len = static_cast<int64_t>(text.size());
    text.resize((text.size() + 7) / 8 * 8, ' ');  // travels as int64 words
    pipe.send(&len, 1, DType::i64, 0, kTiedWeightTag + 1, ctx);
    pipe.send(text.data(), text.size() / 8, DType::i64, 0, kTiedWeightTag + 1, ctx);
    for (const auto& [name, t] : mine) pipe.send(t.contiguous(), 0, kTiedWeightTag + 1, ctx);
    return {};
  }
  for (int from = 1; from < p; ++from) {
    int64_t len = 0;
    pipe.recv(&len, 1, DType::i64, from, kTiedWeightTag + 1, ctx);
    std::string text((static_cast<size_t>(len) + 7) / 8 * 8, ' ');
    pipe.recv(text.data(), text.size() / 8, DType::i64, from, kTiedWeightTag + 1, ctx);
    for (const auto& h : nlohmann::json::parse(text)) {
      Tensor t = Tensor::empty(h["shape"].get<Shape>(), static_cast<DType>(h["dtype"].get<int>()));
      pipe.recv(t, from, kTiedWeightTag + 1, ctx);
      mine.emplace_back(h["name"].get<std::string>(), t);
    }
  }
  return mine;
}

}  // namespace ds::runtime
