#pragma once
// Rotary position embedding frequencies: the inverse-frequency rules of Hugging Face's
// modeling_rope_utils.py (transformers 5) for the rope types our LLaMA layout supports.
//
//   default  inv_freq[i] = theta^(-2i/hd), i < hd/2
//   linear   inv_freq / factor
//   llama3   by wavelength 2*pi/inv_freq against original_max_position / {low,high}_freq_factor:
//            long waves / factor, short waves unchanged, a smooth mix in between
//   yarn     a linear ramp between interpolated (/ factor) and original frequencies over the
//            correction range from beta_fast / beta_slow at original_max_position (floored / ceiled
//            when truncate); cos and sin are multiplied by attention_factor
//            (default 0.1 * ln(factor) + 1)
//   longrope inv_freq[i] = theta^(-2i/hd) / ext[i], ext = short_factor while the sequence (largest
//            position + 1) is within original_max_position, long_factor beyond it (Phi-3's
//            LongRoPE, "su"); cos and sin are multiplied by attention_factor (default
//            sqrt(1 + ln(factor) / ln(original_max_position)), 1 when factor <= 1)
//
// dynamic (NTK) is not supported: the importer refuses it by name. longrope is the one type whose
// table depends on the sequence: rope_inv_freq takes its length, the attention picks the table per
// forward and per decode step, and models::GPTDecoder recomputes a cached sequence when a step
// takes it past original_max_position (as Phi3ForCausalLM's generate() does). The rotation pairs
// (i, i + hd/2) ("rotate_half"), see ops::rope.
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace ds::nn {

struct RopeScaling {
  std::string type = "default";       // default | linear | llama3 | yarn | longrope
  double factor = 1.0;                // linear, llama3, yarn; longrope: for attention_factor only
  double low_freq_factor = 1.0;       // llama3
  double high_freq_factor = 4.0;      // llama3
  int64_t original_max_position = 0;  // llama3, yarn, longrope (required there, > 0)
  double beta_fast = 32.0;            // yarn
  double beta_slow = 1.0;             // yarn
  double attention_factor = 0.0;      // yarn, longrope; 0 = the type's default (above)
  bool truncate = true;               // yarn
  std::vector<double> short_factor;   // longrope: (rotary_dim/2) divisors of the frequencies
  std::vector<double> long_factor;    // longrope: the same beyond original_max_position

  static const std::vector<std::string>& type_names();  // the supported types
  bool is_default() const { return type == "default"; }
  // Throws "[model] rope_scaling.<field> ..." naming the first bad field.
  void validate() const;
  // {"type": ..., and the fields the type uses}; from_json rejects unknown keys.
  nlohmann::json to_json() const;
  static RopeScaling from_json(const nlohmann::json& j);
  bool operator==(const RopeScaling&) const = default;
};

// (hd/2) inverse frequencies of head size hd (even) for base theta, in double. seq_len (the largest
// position + 1) matters for longrope only: long_factor when it exceeds original_max_position.
std::vector<double> rope_inv_freq(const RopeScaling& s, double theta, int64_t hd,
                                  int64_t seq_len = 0);
// Whether sequences of seq_len take another table than shorter ones (longrope beyond
// original_max_position).
bool rope_uses_long_table(const RopeScaling& s, int64_t seq_len);
// The factor on cos and sin: attention_factor for yarn and longrope, else 1.
float rope_attention_scale(const RopeScaling& s);

}  // namespace ds::nn
