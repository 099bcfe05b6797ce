#include "ds/serve/sampling.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/core/rng.h"

namespace ds::serve {

void SamplingParams::validate() const {
  DS_CHECK(max_tokens >= 0, "[sampling] max_tokens must be >= 0, got {}", max_tokens);
  DS_CHECK(std::isfinite(temperature) && temperature >= 0.0f,
           "[sampling] temperature must be >= 0 (0 = greedy), got {}", temperature);
  DS_CHECK(top_k >= 0, "[sampling] top_k must be >= 0 (0 = off), got {}", top_k);
  DS_CHECK(top_p > 0.0f && top_p <= 1.0f, "[sampling] top_p must be in (0, 1], got {}", top_p);
  DS_CHECK(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f,
           "[sampling] repetition_penalty must be > 0 (1 = off), got {}", repetition_penalty);
  DS_CHECK(std::isfinite(presence_penalty) && std::abs(presence_penalty) <= 2.0f,
           "[sampling] presence_penalty must be in [-2, 2], got {}", presence_penalty);
  DS_CHECK(std::isfinite(frequency_penalty) && std::abs(frequency_penalty) <= 2.0f,
           "[sampling] frequency_penalty must be in [-2, 2], got {}", frequency_penalty);
  for (const auto& s : stop) DS_CHECK(!s.empty(), "[sampling] stop strings must not be empty");
}

// ---- generation_config.json ----

GenerationDefaults GenerationDefaults::from_json(const nlohmann::json& j,
                                                 const std::string& source) {
  DS_CHECK(j.is_object(), "[generation_config] {}: expected a JSON object", source);
  GenerationDefaults d;
  auto num = [&](const char* key) -> std::optional<double> {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::nullopt;
    DS_CHECK(it->is_number(), "[generation_config] {}: {} must be a number, got {}", source, key,
             it->dump());
    return it->get<double>();
  };
  if (auto v = num("temperature")) d.temperature = static_cast<float>(*v);
  if (auto v = num("top_p")) d.top_p = static_cast<float>(*v);
  if (auto v = num("repetition_penalty")) d.repetition_penalty = static_cast<float>(*v);
  if (auto v = num("top_k")) d.top_k = static_cast<int64_t>(*v);
  if (auto v = num("max_new_tokens")) d.max_new_tokens = static_cast<int64_t>(*v);
  if (auto it = j.find("do_sample"); it != j.end() && !it->is_null()) {
    DS_CHECK(it->is_boolean(), "[generation_config] {}: do_sample must be true or false", source);
    d.do_sample = it->get<bool>();
  }
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    if (it->is_number_integer()) {
      d.eos_token_ids.push_back(it->get<int32_t>());
    } else {
      DS_CHECK(it->is_array(), "[generation_config] {}: eos_token_id must be an int or a list",
               source);
      for (const auto& e : *it) {
        DS_CHECK(e.is_number_integer(),
                 "[generation_config] {}: eos_token_id entries must be ints, got {}", source,
                 e.dump());
        d.eos_token_ids.push_back(e.get<int32_t>());
      }
    }
  }
  return d;
}

GenerationDefaults GenerationDefaults::load(const std::filesystem::path& dir) {
  const auto file = dir / "generation_config.json";
  if (!std::filesystem::exists(file)) return {};
  std::ifstream in(file);
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    DS_THROW("[generation_config] {}: not valid JSON: {}", file.string(), e.what());
  }
  return from_json(j, file.string());
}

SamplingParams GenerationDefaults::apply(SamplingParams p) const {
  if (temperature) p.temperature = *temperature;
  if (do_sample && !*do_sample) p.temperature = 0.0f;  // transformers: greedy
  if (top_p) p.top_p = *top_p;
  if (top_k) p.top_k = *top_k;
  if (repetition_penalty) p.repetition_penalty = *repetition_penalty;
  if (max_new_tokens) p.max_tokens = *max_new_tokens;
  return p;
}

// ---- sampling ----

int32_t sample_next(std::span<float> logits, std::span<const int32_t> history, int64_t n_prompt,
                    const SamplingParams& p, uint64_t step) {
  const int64_t V = static_cast<int64_t>(logits.size());
  DS_CHECK(V > 0, "[sampling] empty logits");
  if (p.repetition_penalty != 1.0f) {
    std::unordered_set<int32_t> seen(history.begin(), history.end());
    for (int32_t id : seen) {
      if (id < 0 || id >= V) continue;
      float& l = logits[static_cast<size_t>(id)];
      l = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int64_t> count;
    for (size_t i = static_cast<size_t>(std::max<int64_t>(n_prompt, 0)); i < history.size(); ++i)
      ++count[history[i]];
    for (auto [id, c] : count) {
      if (id < 0 || id >= V) continue;
      logits[static_cast<size_t>(id)] -=
          p.presence_penalty + p.frequency_penalty * static_cast<float>(c);
    }
  }
  // Greedy: the first maximum, i.e. the lowest id on ties (torch.argmax does the same).
  if (p.temperature == 0.0f) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  const double u = rng::uniform01(rng::hash3(p.seed, step, 0));
  const double inv_t = 1.0 / p.temperature;
  if (p.top_k == 0 && p.top_p >= 1.0f) {  // the whole distribution: no sort needed
    const double mx = *std::max_element(logits.begin(), logits.end());
    std::vector<double> w(static_cast<size_t>(V));
    double z = 0.0;
    for (int64_t i = 0; i < V; ++i)
      z += w[static_cast<size_t>(i)] = std::exp((logits[i] - mx) * inv_t);
    double acc = 0.0, target = u * z;
    for (int64_t i = 0; i < V; ++i) {
      acc += w[static_cast<size_t>(i)];
      if (target < acc) return static_cast<int32_t>(i);
    }
    return static_cast<int32_t>(V - 1);
  }
  // Candidates, most likely first (ties by the lower id, so the order never depends on the sort).
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  auto better = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  const int64_t k = p.top_k > 0 ? std::min(p.top_k, V) : V;
  std::partial_sort(order.begin(), order.begin() + k, order.end(), better);
  order.resize(static_cast<size_t>(k));
  const double mx = logits[order[0]];
  std::vector<double> w(order.size());
  double z = 0.0;
  for (size_t i = 0; i < order.size(); ++i) z += w[i] = std::exp((logits[order[i]] - mx) * inv_t);
  size_t keep = order.size();
  if (p.top_p < 1.0f) {  // the smallest prefix whose probability reaches top_p (at least one)
    double cum = 0.0;
    for (size_t i = 0; i < order.size(); ++i) {
      cum += w[i] / z;
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
    z = 0.0;
    for (size_t i = 0; i < keep; ++i) z += w[i];
  }
  double acc = 0.0, target = u * z;
  for (size_t i = 0; i < keep; ++i) {
    acc += w[i];
    if (target < acc) return order[i];
  }
  return order[keep - 1];
}

size_t find_stop(const std::string& text, const std::vector<std::string>& stop, size_t from) {
  size_t best = std::string::npos;
  for (const auto& s : stop) {
    if (s.empty()) continue;
    const size_t at = text.find(s, from);
    if (at < best) best = at;
  }
  return best;
}

size_t stop_prefix_len(const std::string& text, const std::vector<std::string>& stop) {
  size_t best = 0;
  for (const auto& s : stop)
    if (!s.empty())
      for (size_t len = std::min(s.size() - 1, text.size()); len > best; --len)
        if (text.compare(text.size() - len, len, s, 0, len) == 0) {
          best = len;
          break;
        }
  return best;
}

}  // namespace ds::serve
