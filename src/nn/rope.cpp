#include "ds/nn/rope.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "ds/core/error.h"

namespace ds::nn {

namespace {

void validate_longrope(const RopeScaling& s) {
  DS_CHECK(s.original_max_position > 0,
           "[model] rope_scaling.original_max_position_embeddings must be positive for longrope, "
           "got {}",
           s.original_max_position);
  DS_CHECK(s.factor > 0.0, "[model] rope_scaling.factor must be positive, got {}", s.factor);
  DS_CHECK(s.attention_factor >= 0.0,
           "[model] rope_scaling.attention_factor must be >= 0 (0 = default), got {}",
           s.attention_factor);
  DS_CHECK(!s.short_factor.empty() && s.short_factor.size() == s.long_factor.size(),
           "[model] rope_scaling.short_factor and long_factor must be non-empty and of one length "
           "(rotary dims / 2), got {} and {}",
           s.short_factor.size(), s.long_factor.size());
  for (const auto* v : {&s.short_factor, &s.long_factor})
    for (double f : *v)
      DS_CHECK(std::isfinite(f) && f > 0.0,
               "[model] rope_scaling.{} holds {}: every factor must be positive",
               v == &s.short_factor ? "short_factor" : "long_factor", f);
}

}  // namespace

const std::vector<std::string>& RopeScaling::type_names() {
  static const std::vector<std::string> names = {"default", "linear", "llama3", "yarn", "longrope"};
  return names;
}

void RopeScaling::validate() const {
  const auto& names = type_names();
  DS_CHECK(std::find(names.begin(), names.end(), type) != names.end(),
           "[model] rope_scaling.type \"{}\" is not supported (supported: {})", type,
           fmt::join(names, ", "));
  if (is_default()) return;
  if (type == "longrope") return validate_longrope(*this);
  DS_CHECK(factor >= 1.0, "[model] rope_scaling.factor must be >= 1, got {}", factor);
  if (type == "llama3" || type == "yarn")
    DS_CHECK(
        original_max_position > 0,
        "[model] rope_scaling.original_max_position_embeddings must be positive for {}, got {}",
        type, original_max_position);
  if (type == "llama3")
    DS_CHECK(high_freq_factor > low_freq_factor && low_freq_factor > 0.0,
             "[model] rope_scaling needs 0 < low_freq_factor < high_freq_factor, got {} and {}",
             low_freq_factor, high_freq_factor);
  if (type == "yarn") {
    DS_CHECK(beta_fast > 0.0 && beta_slow > 0.0,
             "[model] rope_scaling.beta_fast / beta_slow must be positive, got {} / {}", beta_fast,
             beta_slow);
    DS_CHECK(attention_factor >= 0.0,
             "[model] rope_scaling.attention_factor must be >= 0 (0 = default), got {}",
             attention_factor);
  }
}

nlohmann::json RopeScaling::to_json() const {
  nlohmann::json j = {{"type", type}};
  if (is_default()) return j;
  j["factor"] = factor;
  if (type == "llama3") {
    j["low_freq_factor"] = low_freq_factor;
    j["high_freq_factor"] = high_freq_factor;
  }
  if (type == "llama3" || type == "yarn")
    j["original_max_position_embeddings"] = original_max_position;
  if (type == "yarn") {
    j["beta_fast"] = beta_fast;
    j["beta_slow"] = beta_slow;
    j["attention_factor"] = attention_factor;
    j["truncate"] = truncate;
  }
  if (type == "longrope") {
    j["original_max_position_embeddings"] = original_max_position;
    j["attention_factor"] = attention_factor;
    j["short_factor"] = short_factor;
    j["long_factor"] = long_factor;
  }
  return j;
}

RopeScaling RopeScaling::from_json(const nlohmann::json& j) {
  DS_CHECK(j.is_object(), "[model] rope_scaling must be a JSON object, got {}", j.dump());
  RopeScaling s;
  for (const auto& [key, v] : j.items()) {
    try {
      if (key == "type")
        s.type = v.get<std::string>();
      else if (key == "factor")
        s.factor = v.get<double>();
      else if (key == "low_freq_factor")
        s.low_freq_factor = v.get<double>();
      else if (key == "high_freq_factor")
        s.high_freq_factor = v.get<double>();
      else if (key == "original_max_position_embeddings")
        s.original_max_position = v.get<int64_t>();
      else if (key == "beta_fast")
        s.beta_fast = v.get<double>();
      else if (key == "beta_slow")
        s.beta_slow = v.get<double>();
      else if (key == "attention_factor")
        s.attention_factor = v.get<double>();
      else if (key == "truncate")
        s.truncate = v.get<bool>();
      else if (key == "short_factor")
        s.short_factor = v.get<std::vector<double>>();
      else if (key == "long_factor")
        s.long_factor = v.get<std::vector<double>>();
      else
        DS_THROW(
            "[model] unknown key '{}' in rope_scaling (known: type, factor, low_freq_factor, "
            "high_freq_factor, original_max_position_embeddings, beta_fast, beta_slow, "
            "attention_factor, truncate, short_factor, long_factor)",
            key);
    } catch (const nlohmann::json::exception& e) {
      DS_THROW("[model] bad value for rope_scaling.{}: {}", key, e.what());
    }
  }
  s.validate();
  return s;
}

bool rope_uses_long_table(const RopeScaling& s, int64_t seq_len) {
  return s.type == "longrope" && seq_len > s.original_max_position;
}

std::vector<double> rope_inv_freq(const RopeScaling& s, double theta, int64_t hd, int64_t seq_len) {
  DS_CHECK(hd > 0 && hd % 2 == 0, "[rope] head size {} must be even", hd);
  const int64_t half = hd / 2;
  const double dim = static_cast<double>(hd);
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv[i] = std::pow(theta, -2.0 * static_cast<double>(i) / dim);
  if (s.type == "linear") {
    for (auto& f : inv) f /= s.factor;
  } else if (s.type == "longrope") {
    const std::vector<double>& ext =
        rope_uses_long_table(s, seq_len) ? s.long_factor : s.short_factor;
    DS_CHECK(static_cast<int64_t>(ext.size()) == half,
             "[rope] longrope has {} factors for {} rotary dims; it needs one per pair ({})",
             ext.size(), hd, half);
    for (int64_t i = 0; i < half; ++i) inv[i] /= ext[i];
  } else if (s.type == "llama3") {
    const double L0 = static_cast<double>(s.original_max_position);
    const double low_wavelen = L0 / s.low_freq_factor, high_wavelen = L0 / s.high_freq_factor;
    for (auto& f : inv) {
      const double wavelen = 2.0 * M_PI / f;
      if (wavelen > low_wavelen) {
        f /= s.factor;
      } else if (wavelen >= high_wavelen) {  // medium: mix by how far between the two
        const double smooth =
            (L0 / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1.0 - smooth) * f / s.factor + smooth * f;
      }
    }
  } else if (s.type == "yarn") {
    // The dimension index at which a frequency makes num_rotations turns over the original context.
    const double L0 = static_cast<double>(s.original_max_position);
    auto correction_dim = [&](double num_rotations) {
      return dim * std::log(L0 / (num_rotations * 2.0 * M_PI)) / (2.0 * std::log(theta));
    };
    double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
    if (s.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1.0);
    if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
    for (int64_t i = 0; i < half; ++i) {
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      const double extrapolation = 1.0 - ramp;  // 1: keep the original frequency
      const double f = inv[i];
      inv[i] = f / s.factor * (1.0 - extrapolation) + f * extrapolation;
    }
  }
  return inv;
}

float rope_attention_scale(const RopeScaling& s) {
  if (s.type != "yarn" && s.type != "longrope") return 1.0f;
  if (s.attention_factor > 0.0) return static_cast<float>(s.attention_factor);
  if (s.factor <= 1.0) return 1.0f;
  if (s.type == "longrope")  // LongRoPE's scale for the context extended `factor` times
    return static_cast<float>(std::sqrt(
        1.0 + std::log(s.factor) / std::log(static_cast<double>(s.original_max_position))));
  return static_cast<float>(0.1 * std::log(s.factor) + 1.0);
}

}  // namespace ds::nn
