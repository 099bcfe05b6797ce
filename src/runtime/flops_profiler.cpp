#include "ds/runtime/flops_profiler.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <utility>

#include "ds/core/error.h"
#include "ds/core/file_io.h"

namespace ds::runtime {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double round2(double x) { return std::nearbyint(x * 100.0) / 100.0; }

std::string trimmed(std::string s) {
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

std::string params_str(double n) { return trimmed(profile_number(n)); }
std::string macs_str(double n) { return profile_number(n, "MACs"); }
std::string flops_str(double n) { return profile_number(n, "FLOPS"); }
std::string seconds_str(double s) { return profile_number(s, "s"); }
std::string percent(double part, double whole) {
  return fmt::format("{:g}", whole != 0 ? round2(100.0 * part / whole) : 0.0);
}

int64_t subtree_params(const nn::Module& m) { return m.num_parameters(); }

}  // namespace

std::string profile_number(double num, const std::string& suffix) {
  double magnitude = 1;
  const char* units = "";
  if (num >= 1e12) {
    magnitude = 1e12, units = "T";
  } else if (num >= 1e9) {
    magnitude = 1e9, units = "G";
  } else if (num >= 1e6) {
    magnitude = 1e6, units = "M";
  } else if (num >= 1e3) {
    magnitude = 1e3, units = "K";
  } else if (num >= 1 || num == 0) {
    magnitude = 1, units = "";
  } else if (num >= 1e-3) {
    magnitude = 1e-3, units = "m";
  } else {
    magnitude = 1e-6, units = "u";
  }
  return fmt::format("{:g} {}{}", round2(num / magnitude), units, suffix);
}

FlopsProfiler::FlopsProfiler(nn::Module& model) : model_(model) { build_tree(); }

FlopsProfiler::~FlopsProfiler() { stop(); }

void FlopsProfiler::build_tree() {
  for (const auto& [name, m] : model_.named_modules()) {
    if (index_.count(m)) continue;  // a module reached twice is profiled once
    ModuleProfile p;
    p.name = name;
    p.type = m->type_name();
    p.depth = name.empty() ? 0 : 1 + static_cast<int>(std::count(name.begin(), name.end(), '.'));
    p.params = subtree_params(*m);
    index_[m] = modules_.size();
    modules_.push_back(std::move(p));
  }
  for (const auto& [name, m] : model_.named_modules()) {
    const size_t i = index_.at(m);
    if (modules_[i].name != name) continue;
    for (const auto& child : m->children()) {
      const size_t c = index_.at(child.second.get());
      if (modules_[c].name == (name.empty() ? child.first : name + "." + child.first))
        modules_[i].children.push_back(c);
    }
  }
}

void FlopsProfiler::start() {
  stop();
  for (auto& m : modules_) m.own = {}, m.seconds = 0;
  by_op_.clear();
  stack_.clear();
  for (const auto& [name, m] : model_.named_modules()) {
    const size_t i = index_.at(m);
    if (modules_[i].name != name) continue;
    std::vector<int> handles;
    handles.push_back(m->register_forward_pre_hook(
        [this, i](nn::Module&, const Tensor&) { stack_.emplace_back(i, now_seconds()); }));
    handles.push_back(m->register_forward_hook(
        [this, i](nn::Module&, const Tensor&, const Tensor&) {
          // Pops this module's call (calls nest, so it is the top unless a hook threw).
          while (!stack_.empty()) {
            const auto [j, t0] = stack_.back();
            stack_.pop_back();
            modules_[j].seconds += now_seconds() - t0;
            if (j == i) break;
          }
        }));
    hooks_.emplace_back(m, std::move(handles));
  }
  counting_ = std::make_unique<ops::FlopCounting>(this);
  started_ = now_seconds();
}

void FlopsProfiler::stop() {
  if (!counting_) return;
  counting_.reset();
  seconds_ = now_seconds() - started_;
  for (auto& [m, handles] : hooks_)
    for (int h : handles) m->remove_hook(h);
  hooks_.clear();
  stack_.clear();
}

void FlopsProfiler::add(const char* op, const ops::OpCost& cost) {
  ModuleProfile& m = modules_[stack_.empty() ? 0 : stack_.back().first];
  m.own.flops += cost.flops;
  m.own.macs += cost.macs;
  m.own.gemm_flops += cost.gemm_flops;
  ops::OpCost& o = by_op_[op];
  o.flops += cost.flops;
  o.macs += cost.macs;
  o.gemm_flops += cost.gemm_flops;
}

ops::OpCost FlopsProfiler::subtree_cost(size_t i) const {
  ops::OpCost c = modules_.at(i).own;
  for (size_t k : modules_[i].children) {
    const ops::OpCost s = subtree_cost(k);
    c.flops += s.flops, c.macs += s.macs, c.gemm_flops += s.gemm_flops;
  }
  return c;
}

double FlopsProfiler::module_seconds(size_t i) const {
  if (i == 0 && modules_[0].seconds == 0) return seconds_;  // the loss did not call the root
  double s = modules_.at(i).seconds;
  if (s == 0)
    for (size_t k : modules_[i].children) s += module_seconds(k);
  return s;
}

std::string FlopsProfiler::summary(const ProfileRun& run) const {
  const ops::OpCost t = total();
  const double params = static_cast<double>(modules_[0].params);
  std::string out;
  auto line = [&out](const std::string& label, const std::string& value) {
    out += fmt::format("{:<70}  {:<8}\n", label, value);
  };
  out += "\n-------------------------- DeepSpeed Flops Profiler --------------------------\n";
  out += fmt::format("Profile Summary at step {}:\n", run.profile_step);
  out +=
      "Notations:\n"
      "data parallel size (dp_size), model parallel size(mp_size),\n"
      "number of parameters (params), number of multiply-accumulate operations(MACs),\n"
      "number of floating-point operations (flops), floating-point operations per second "
      "(FLOPS),\n"
      "fwd latency (forward propagation latency), bwd latency (backward propagation latency),\n"
      "step (weights update latency), iter latency (sum of fwd, bwd and step latency)\n\n";
  line("world size: ", std::to_string(run.world_size));
  line("data parallel size: ", std::to_string(run.dp_size));
  line("model parallel size: ", std::to_string(run.mp_size));
  line("batch size per GPU: ", std::to_string(run.micro_batch));
  line("params per GPU: ", params_str(params));
  line("params of model = params per GPU * mp_size: ", params_str(params * run.mp_size));
  line("fwd MACs per GPU: ", macs_str(t.macs));
  line("fwd flops per GPU: ", profile_number(t.flops));
  line("fwd flops of model = fwd flops per GPU * mp_size: ", profile_number(t.flops * run.mp_size));
  const double fwd = run.fwd_seconds;
  line("fwd latency: ", seconds_str(fwd));
  line("fwd FLOPS per GPU = fwd flops per GPU / fwd latency: ",
       flops_str(fwd > 0 ? t.flops / fwd : 0));
  if (run.bwd_seconds && run.step_seconds) {
    const double bwd_factor = 2 + run.recompute_fwd_factor;
    const double bwd = *run.bwd_seconds, step = *run.step_seconds;
    const double iter = fwd + bwd + step;
    line("bwd latency: ", seconds_str(bwd));
    line(fmt::format("bwd FLOPS per GPU = {:g} * fwd flops per GPU / bwd latency: ", bwd_factor),
         flops_str(bwd > 0 ? bwd_factor * t.flops / bwd : 0));
    line(fmt::format("fwd+bwd FLOPS per GPU = {:g} * fwd flops per GPU / (fwd+bwd latency): ",
                     bwd_factor + 1),
         flops_str(fwd + bwd > 0 ? (bwd_factor + 1) * t.flops / (fwd + bwd) : 0));
    line("step latency: ", seconds_str(step));
    line("iter latency: ", seconds_str(iter));
    line(fmt::format("FLOPS per GPU = {:g} * fwd flops per GPU / iter latency: ", bwd_factor + 1),
         flops_str(iter > 0 ? (bwd_factor + 1) * t.flops / iter : 0));
    line("samples/second: ",
         fmt::format("{:g}", iter > 0 ? round2(static_cast<double>(run.micro_batch) *
                                               run.world_size / iter)
                                      : 0.0));
  }
  return out;
}

std::string FlopsProfiler::aggregated(int64_t module_depth, int64_t top_modules) const {
  // Per depth, per module type: (MACs, params, latency) summed over the modules of that type.
  std::vector<std::vector<std::pair<std::string, std::array<double, 3>>>> info;
  std::vector<std::map<std::string, size_t>> where;
  for (size_t i = 0; i < modules_.size(); ++i) {
    const auto d = static_cast<size_t>(modules_[i].depth);
    if (info.size() <= d) info.resize(d + 1), where.resize(d + 1);
    auto [it, fresh] = where[d].emplace(modules_[i].type, info[d].size());
    if (fresh) info[d].push_back({modules_[i].type, {0, 0, 0}});
    auto& v = info[d][it->second].second;
    v[0] += subtree_cost(i).macs;
    v[1] += static_cast<double>(modules_[i].params);
    v[2] += module_seconds(i);
  }
  const int64_t depth = module_depth == -1 ? static_cast<int64_t>(info.size()) - 1 : module_depth;
  std::string out = fmt::format(
      "Top {} modules in terms of params, MACs or fwd latency at different model depths:\n",
      top_modules);
  // DeepSpeed prints depths [0, depth): with module_depth = -1 all but the innermost.
  for (int64_t d = 0; d < std::min<int64_t>(depth, static_cast<int64_t>(info.size())); ++d) {
    auto rows = info[static_cast<size_t>(d)];
    const size_t n = std::min<size_t>(static_cast<size_t>(std::max<int64_t>(top_modules, 0)), rows.size());
    auto top = [&](int k, std::string (*str)(double)) {
      std::stable_sort(rows.begin(), rows.end(),
                       [k](const auto& a, const auto& b) { return a.second[k] > b.second[k]; });
      std::string s = "{";
      for (size_t j = 0; j < n; ++j)
        s += fmt::format("{}'{}': '{}'", j ? ", " : "", rows[j].first, str(rows[j].second[k]));
      return s + "}";
    };
    out += fmt::format("depth {}:\n", d);
    out += fmt::format("    params      - {}\n", top(1, params_str));
    out += fmt::format("    MACs        - {}\n", top(0, macs_str));
    out += fmt::format("    fwd latency - {}\n", top(2, seconds_str));
  }
  return out;
}

void FlopsProfiler::print_tree(size_t i, const std::string& label, int indent,
                               std::string& out) const {
  const ModuleProfile& m = modules_[i];
  const ops::OpCost t = total(), c = subtree_cost(i);
  const double s = module_seconds(i), total_s = module_seconds(0);
  const std::string items = fmt::format(
      "{} = {}% Params, {} = {}% MACs, {} = {}% latency, {}", params_str(static_cast<double>(m.params)),
      percent(static_cast<double>(m.params), static_cast<double>(modules_[0].params)),
      macs_str(c.macs), percent(c.macs, t.macs), seconds_str(s), percent(s, total_s),
      flops_str(s > 0 ? round2(c.flops / s) : 0));
  const std::string pad(static_cast<size_t>(indent), ' ');
  out += label + m.type + "(";
  if (m.children.empty()) {
    out += items + ")\n";
    return;
  }
  out += "\n" + pad + "  " + items + "\n";
  for (size_t k : m.children) {
    const std::string& full = modules_[k].name;
    const std::string local = full.substr(m.name.empty() ? 0 : m.name.size() + 1);
    out += pad + "  ";
    print_tree(k, "(" + local + "): ", indent + 2, out);
  }
  out += pad + ")\n";
}

std::string FlopsProfiler::report(const ProfileRun& run,
                                  const config::FlopsProfilerConfig& cfg) const {
  std::string out = summary(run);
  out += "\n----------------------------- Aggregated Profile per GPU -----------------------------\n";
  out += aggregated(cfg.module_depth, cfg.top_modules);
  if (cfg.detailed) {
    out +=
        "\n------------------------------ Detailed Profile per GPU "
        "------------------------------\n"
        "Each module profile is listed after its name in the following order: \n"
        "params, percentage of total params, MACs, percentage of total MACs, fwd latency, "
        "percentage of total fwd latency, fwd FLOPS\n\n"
        "Note: 1. A module can compute with ops outside its submodules (e.g. the loss). They "
        "are not counted as submodules, thus not printed out; they make up the difference "
        "between a parent's MACs (or latency) and the sum of its submodules'.\n"
        "2. Number of floating-point operations is a theoretical estimation (ops/flop_count.h "
        "lists each op's rule), thus FLOPS computed using that could be larger than the maximum "
        "system throughput.\n"
        "3. The fwd latency listed in the top module's profile is measured around the model's "
        "loss in the engine's forward.\n\n";
    print_tree(0, "", 0, out);
  }
  out += "------------------------------------------------------------------------------\n";
  return out;
}

// ---- the engine's side ----

FlopsProfileStep::FlopsProfileStep(nn::Module& model, config::FlopsProfilerConfig cfg,
                                   ProfileRun run, bool wall_clock_breakdown,
                                   std::function<void(const std::string&)> log)
    : profiler_(model),
      cfg_(std::move(cfg)),
      run_(run),
      wall_clock_(wall_clock_breakdown),
      log_(std::move(log)) {
  run_.profile_step = cfg_.profile_step;
  run_.recompute_fwd_factor = cfg_.recompute_fwd_factor;
}

bool FlopsProfileStep::wants(int64_t global_steps) const {
  return !done_ && !profiled_ && global_steps == cfg_.profile_step;
}

FlopsProfileStep::Forward::Forward(FlopsProfileStep* owner, int64_t global_steps) {
  if (owner == nullptr || !owner->wants(global_steps)) return;
  owner_ = owner;
  owner_->profiler_.start();
}

FlopsProfileStep::Forward::~Forward() {
  if (owner_ == nullptr) return;
  owner_->profiler_.stop();
  owner_->profiled_ = true;
  owner_->run_.fwd_seconds = owner_->profiler_.seconds();
}

void FlopsProfileStep::add_backward_seconds(double s) {
  if (profiled_ && !done_) bwd_seconds_ += s;
}

void FlopsProfileStep::after_step(double step_seconds) {
  if (!profiled_ || done_) return;
  done_ = true;
  if (wall_clock_) run_.bwd_seconds = bwd_seconds_, run_.step_seconds = step_seconds;
  const std::string text = profiler_.report(run_, cfg_);
  if (cfg_.output_file && !cfg_.output_file->empty()) {
    // Only rank 0 profiles: a file it cannot write must not stop it while the other ranks go on
    // into the next step's collectives, so the failure is said and the profile printed instead.
    try {
      const std::filesystem::path path(*cfg_.output_file);
      if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
      write_file_atomic(path, text);
      if (log_) log_(fmt::format("[flops_profiler] profile of step {} written to {}",
                                 cfg_.profile_step, *cfg_.output_file));
    } catch (const std::exception& e) {
      if (log_)
        log_(fmt::format("[flops_profiler] could not write output_file {} ({}); the profile "
                         "follows here instead\n{}",
                         *cfg_.output_file, e.what(), text));
    }
  } else if (log_) {
    log_(text);
  }
}

}  // namespace ds::runtime
