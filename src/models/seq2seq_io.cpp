// Hugging Face import and export of sequence-to-sequence models (ds/models/seq2seq_io.h).
#include "ds/models/seq2seq_io.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ds/autograd/grad_mode.h"
#include "ds/core/error.h"
#include "ds/core/safetensors.h"
#include "ds/models/family.h"
#include "hf_weights.h"

namespace ds::models {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json read_json_file(const fs::path& p) {
  std::ifstream in(p);
  DS_CHECK(in.good(), "[hf_io] cannot read '{}'", p.string());
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    DS_THROW("[hf_io] {}: not valid JSON ({})", p.string(), e.what());
  }
}

}  // namespace

Seq2SeqConfig seq2seq_config_from_json(const json& j, const std::string& source) {
  DS_CHECK(j.is_object(), "[hf_io] {}: config.json must be a JSON object", source);
  DS_CHECK(j.contains("model_type") && j["model_type"].is_string(),
           "[hf_io] {}: no \"model_type\"; a sequence-to-sequence config.json names {}", source,
           supported_model_types(ModelKind::seq2seq));
  const std::string type = j["model_type"].get<std::string>();
  const Family& family = family_for_model_type(type, source, ModelKind::seq2seq);
  if (j.contains("ds_cpp")) {
    try {
      return Seq2SeqConfig::from_json(j["ds_cpp"]);
    } catch (const Error& e) {
      DS_THROW("[hf_io] {}: \"ds_cpp\": {}", source, e.what());
    }
  }
  return family.seq2seq.read_config(j, type, source);
}

json seq2seq_config_to_json(const Seq2SeqConfig& c) {
  json j = family_of(c).seq2seq.write_config(c);
  j["ds_cpp"] = c.to_json();
  return j;
}

std::optional<Seq2SeqConfig> read_hf_seq2seq_config(const fs::path& path) {
  const fs::path file = path / "config.json";
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return std::nullopt;
  const json j = read_json_file(file);
  if (!j.is_object() || !j.contains("model_type") || !j["model_type"].is_string()) return std::nullopt;
  const Family* f = find_family(j["model_type"].get<std::string>());
  if (!f || f->kind != ModelKind::seq2seq) return std::nullopt;
  Seq2SeqConfig c = seq2seq_config_from_json(j, file.string());
  // transformers 5 always builds T5's lm_head tied, and unties it when the file's lm_head.weight
  // differs from shared.weight (a t5-v1_1 / flan-t5 model saved by 5.x says tie_word_embeddings
  // true): so do we.
  if (c.is_t5() && c.tie_word_embeddings && !j.contains("ds_cpp")) {
    std::vector<safetensors::Reader> readers;
    try {
      for (const auto& f : detail::weight_files(path)) readers.emplace_back(f.string());
    } catch (const Error&) {
      return c;  // no weights here: the config alone decides
    }
    const safetensors::Reader *head = nullptr, *shared = nullptr;
    for (const auto& r : readers)
      for (const auto& e : r.entries()) {
        if (e.name == "lm_head.weight") head = &r;
        if (e.name == "shared.weight") shared = &r;
      }
    if (head && shared &&
        head->get("lm_head.weight").to_vector() != shared->get("shared.weight").to_vector())
      c.tie_word_embeddings = false;
  }
  return c;
}

namespace {

// A token id setting: an int, null (-1: none) or a list of one id.
int64_t token_setting(const json& v, const char* key, const std::string& source) {
  if (v.is_null()) return -1;
  if (v.is_number_integer()) return v.get<int64_t>();
  DS_CHECK(v.is_array() && v.size() == 1 && v[0].is_number_integer(),
           "[hf_io] {}: \"{}\" = {}: one token id (or null) is supported", source, key, v.dump());
  return v[0].get<int64_t>();
}

}  // namespace

BeamOptions read_hf_generation_options(const fs::path& dir, const Seq2SeqConfig& c) {
  const fs::path gen_file = dir / "generation_config.json";
  std::error_code ec;
  const bool own = fs::is_regular_file(gen_file, ec);
  const fs::path file = own ? gen_file : dir / "config.json";
  const std::string source = file.string();
  const json j = read_json_file(file);
  DS_CHECK(j.is_object(), "[hf_io] {}: must be a JSON object", source);
  BeamOptions o;
  o.num_beams = 1;
  o.eos_token_id = c.eos_token_id;
  o.forced_eos_token_id = c.forced_eos_token_id;
  // -1 = not set (null counts as not set: transformers drops a config's None values).
  int64_t max_length = -1, max_new_tokens = -1, min_new_tokens = -1;
  // Settings that change nothing when do_sample is false, and bookkeeping.
  static const std::set<std::string> harmless = {"_from_model_config",
                                                 "transformers_version",
                                                 "use_cache",
                                                 "output_attentions",
                                                 "output_hidden_states",
                                                 "output_scores",
                                                 "output_logits",
                                                 "return_dict_in_generate",
                                                 "pad_token_id",
                                                 "bos_token_id",
                                                 "decoder_start_token_id",
                                                 "temperature",
                                                 "top_k",
                                                 "top_p",
                                                 "typical_p",
                                                 "min_p",
                                                 "epsilon_cutoff",
                                                 "eta_cutoff",
                                                 "remove_invalid_values",
                                                 "renormalize_logits",
                                                 "cache_implementation",
                                                 "low_memory"};
  for (const auto& [k, v] : j.items()) {
    auto num = [&](auto fallback) {
      try {
        return v.get<decltype(fallback)>();
      } catch (const json::exception&) {
        DS_THROW("[hf_io] {}: bad value for \"{}\": {}", source, k, v.dump());
      }
    };
    if (k == "num_beams")
      o.num_beams = num(int64_t{});
    else if (k == "max_length")
      max_length = v.is_null() ? -1 : num(int64_t{});
    else if (k == "max_new_tokens")
      max_new_tokens = v.is_null() ? -1 : num(int64_t{});
    else if (k == "min_new_tokens")
      min_new_tokens = v.is_null() ? -1 : num(int64_t{});
    else if (k == "min_length")
      o.min_length = v.is_null() ? 0 : num(int64_t{});
    else if (k == "length_penalty")
      o.length_penalty = num(float{});
    else if (k == "no_repeat_ngram_size")
      o.no_repeat_ngram_size = v.is_null() ? 0 : num(int64_t{});
    else if (k == "encoder_no_repeat_ngram_size")
      o.encoder_no_repeat_ngram_size = v.is_null() ? 0 : num(int64_t{});
    else if (k == "early_stopping")
      o.early_stopping = v.is_boolean()  ? (v.get<bool>() ? "true" : "false")
                         : v.is_string() ? v.get<std::string>()
                                         : "?";
    else if (k == "eos_token_id")
      o.eos_token_id = token_setting(v, "eos_token_id", source);
    else if (k == "forced_eos_token_id")
      o.forced_eos_token_id = token_setting(v, "forced_eos_token_id", source);
    else if (k == "forced_bos_token_id")
      o.forced_bos_token_id = token_setting(v, "forced_bos_token_id", source);
    else if (k == "do_sample")
      DS_CHECK(!v.is_boolean() || !v.get<bool>(),
               "[hf_io] {}: \"do_sample\" true: sampling is not supported (greedy and beam "
               "search are)",
               source);
    else if (k == "num_beam_groups" || k == "num_return_sequences")
      DS_CHECK(v.is_null() || (v.is_number_integer() && v.get<int64_t>() == 1),
               "[hf_io] {}: \"{}\" = {} is not supported (1)", source, k, v.dump());
    else if (k == "repetition_penalty" || k == "encoder_repetition_penalty")
      DS_CHECK(v.is_null() || (v.is_number() && v.get<double>() == 1.0),
               "[hf_io] {}: \"{}\" = {} is not supported (1.0)", source, k, v.dump());
    else if (k == "diversity_penalty")
      DS_CHECK(v.is_null() || (v.is_number() && v.get<double>() == 0.0),
               "[hf_io] {}: \"{}\" = {} is not supported (0.0)", source, k, v.dump());
    else if (k == "bad_words_ids" || k == "suppress_tokens" || k == "begin_suppress_tokens" ||
             k == "force_words_ids" || k == "exponential_decay_length_penalty" ||
             k == "sequence_bias")
      DS_CHECK(v.is_null(), "[hf_io] {}: \"{}\" = {} is not supported", source, k, v.dump());
    else if (own)
      DS_CHECK(harmless.count(k),
               "[hf_io] {}: generation setting \"{}\" is not understood; generation stops "
               "rather than ignore it",
               source, k);
  }
  DS_CHECK(o.early_stopping == "true" || o.early_stopping == "false" || o.early_stopping == "never",
           "[hf_io] {}: early_stopping {} is not true, false or \"never\"", source,
           j.value("early_stopping", json()).dump());
  // transformers 5's _prepare_generated_length: max_new_tokens wins; else max_length counts the
  // decoder start token; neither set: 20 new tokens, the length capped at max_position_embeddings
  // (T5's config has none: no cap).
  if (max_new_tokens >= 0)
    o.max_new_tokens = max_new_tokens;
  else if (max_length >= 0)
    o.max_new_tokens = max_length - 1;
  else
    o.max_new_tokens = c.is_t5() ? 20 : std::min<int64_t>(20, c.max_positions - 1);
  // MinNewTokensLengthLogitsProcessor bans eos for min_new_tokens steps after the decoder start:
  // the same as a min_length one longer (both apply: the larger wins).
  if (min_new_tokens > 0) o.min_length = std::max(o.min_length, 1 + min_new_tokens);
  try {
    o.validate();
  } catch (const Error& e) {
    DS_THROW("[hf_io] {}: {}", source, e.what());
  }
  return o;
}

Seq2SeqLoadReport load_hf_seq2seq_weights(Seq2Seq& model, const fs::path& path) {
  const Seq2SeqConfig& cfg = model.config();
  const Family& family = family_of(cfg);
  const Seq2SeqParts& s2s = family.seq2seq;
  // Parameters, then the buffer (optional: transformers' _keys_to_ignore_on_load_missing).
  std::vector<detail::Target> targets;
  for (const auto& [name, p] : model.named_parameters()) targets.push_back({name, p, {name}});
  if (model.final_logits_bias().defined())
    targets.push_back({"final_logits_bias", model.final_logits_bias(), {"final_logits_bias"}, true});
  detail::ImportRules rules;
  rules.describe = fmt::format("a {} model ({} + {} layers, d_model {}, vocab {})", cfg.family,
                               cfg.encoder_layers, cfg.decoder_layers, cfg.d_model,
                               cfg.vocab_size);
  // A tied copy of the shared embedding must equal it: it is skipped, not read.
  rules.unused = [&](const std::string& name, const detail::FileTensor& t,
                     const detail::FileIndex& files) {
    using detail::Unused;
    if (family.is_buffer(name)) return Unused{Unused::ignored, ""};
    const auto shared = files.find(s2s.shared_embedding);
    const bool copy = std::find(s2s.tied_copies.begin(), s2s.tied_copies.end(), name) !=
                      s2s.tied_copies.end();
    if (!copy || shared == files.end()) return Unused{Unused::extra, ""};
    const safetensors::Entry& e = *t.entry;
    if (e.shape == shared->second.entry->shape && e.supported &&
        t.read().to_vector() == shared->second.read().to_vector())
      return Unused{Unused::ignored, ""};
    return Unused{Unused::problem,
                  fmt::format("untied: '{}' differs from {} ({})", name, s2s.shared_embedding,
                              cfg.is_t5() ? "the config ties lm_head to shared: set "
                                            "tie_word_embeddings false, or read the folder with "
                                            "read_hf_seq2seq_config, which unties it"
                                          : "tie_word_embeddings is required")};
  };
  const detail::ImportReport r = detail::import_weights(path, targets, rules);
  return {r.files, r.tensors, r.ignored};
}

void export_hf_seq2seq(const Seq2Seq& model, const fs::path& dir, DType dtype) {
  std::vector<std::pair<std::string, Tensor>> named = model.named_parameters();
  if (model.final_logits_bias().defined())
    named.emplace_back("final_logits_bias", model.final_logits_bias());
  const auto place = [](const std::string& ours) { return HFPlace{ours}; };
  detail::write_hf_folder(dir, detail::export_tensors(named, place, dtype),
                          seq2seq_config_to_json(model.config()), dtype);
}

}  // namespace ds::models
