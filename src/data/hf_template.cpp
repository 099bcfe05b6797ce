// TemplateProcessing / BertProcessing post-processors of tokenizer.json (hf_template.h).
#include "hf_template.h"

#include <algorithm>
#include <string>

#include "ds/core/error.h"
#include "hf_json.h"

namespace ds::data::detail {

namespace fs = std::filesystem;
using ojson = nlohmann::json;

namespace {

std::vector<TemplatePiece> parse_template(const ojson& items, const ojson& specials,
                                          const std::string& field, const fs::path& file, bool pair,
                                          int32_t vocab_size, std::string_view loader) {
  DS_CHECK(items.is_array(), "[tokenizer] '{}': {} must be an array", file.string(), field);
  std::vector<TemplatePiece> out;
  int seen_a = 0, seen_b = 0;
  for (size_t k = 0; k < items.size(); ++k) {
    const ojson& item = items[k];
    const std::string where = fmt::format("{}[{}]", field, k);
    DS_CHECK(item.is_object() && item.size() == 1 &&
                 (item.contains("Sequence") || item.contains("SpecialToken")),
             "[tokenizer] '{}': {} must be {{\"Sequence\": ...}} or {{\"SpecialToken\": ...}}",
             file.string(), where);
    const bool seq = item.contains("Sequence");
    const ojson& body = seq ? item["Sequence"] : item["SpecialToken"];
    check_keys(body, {"id", "type_id"}, where, file, loader);
    DS_CHECK(body.contains("id") && body["id"].is_string() && body.contains("type_id") &&
                 body["type_id"].is_number_unsigned(),
             "[tokenizer] '{}': {} needs a string 'id' and a non-negative 'type_id'", file.string(),
             where);
    TemplatePiece p{TemplatePiece::kSpecial, body["type_id"].get<uint32_t>(), {}};
    const std::string id = body["id"];
    if (seq) {
      DS_CHECK(id == "A" || (pair && id == "B"),
               "[tokenizer] '{}': {} names sequence '{}'; a {} template holds {}", file.string(),
               where, id, pair ? "pair" : "single", pair ? "A and B" : "A only");
      p.kind = id == "A" ? TemplatePiece::kA : TemplatePiece::kB;
      (id == "A" ? seen_a : seen_b)++;
    } else {
      DS_CHECK(specials.contains(id) && specials[id].is_object() && specials[id].contains("ids") &&
                   specials[id]["ids"].is_array(),
               "[tokenizer] '{}': {} uses special token '{}', which post_processor.special_tokens "
               "does not define",
               file.string(), where, id);
      for (const ojson& i : specials[id]["ids"]) {
        DS_CHECK(i.is_number_integer() && i.get<int64_t>() >= 0 && i.get<int64_t>() < vocab_size,
                 "[tokenizer] '{}': post_processor.special_tokens['{}'] has id {} outside the "
                 "vocabulary",
                 file.string(), id, i.dump());
        p.ids.push_back(i.get<int32_t>());
      }
    }
    out.push_back(std::move(p));
  }
  DS_CHECK(seen_a == 1 && seen_b == (pair ? 1 : 0),
           "[tokenizer] '{}': {} must hold sequence A once{}", file.string(), field,
           pair ? " and sequence B once" : "");
  return out;
}

}  // namespace

namespace {

void parse_into(PairTemplate& t, const ojson& j, const std::string& field, int32_t vocab_size,
                const fs::path& file, std::string_view loader,
                const std::vector<std::string_view>& accepted) {
  const std::string type = json_type(j);
  DS_CHECK(std::find(accepted.begin(), accepted.end(), type) != accepted.end(),
           "[tokenizer] '{}': {}.type '{}' is not supported by the {} loader (supported: none, {})",
           file.string(), field, type, loader, fmt::join(accepted, ", "));
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    for_each_in_sequence(j, "processors", field, file, loader,
                         [&](const ojson& item, const std::string& f) {
                           parse_into(t, item, f, vocab_size, file, loader, accepted);
                         });
    return;
  }
  DS_CHECK(t.empty(),
           "[tokenizer] '{}': {} is a second post-processor with special tokens; not "
           "supported",
           file.string(), field);
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    // Bert: [CLS] A [SEP] / [CLS] A [SEP] B [SEP] (B type 1); Roberta: <s> A </s> /
    // <s> A </s></s> B </s>, every type id 0 (tokenizers' roberta.rs).
    const bool roberta = type == "RobertaProcessing";
    if (roberta)
      check_keys(j, {"type", "sep", "cls", "trim_offsets", "add_prefix_space"}, field, file,
                 loader);
    else
      check_keys(j, {"type", "sep", "cls"}, field, file, loader);
    auto token = [&](const char* key) {
      const ojson& v = j.value(key, ojson());
      DS_CHECK(v.is_array() && v.size() == 2 && v[0].is_string() && v[1].is_number_integer() &&
                   v[1].get<int64_t>() >= 0 && v[1].get<int64_t>() < vocab_size,
               "[tokenizer] '{}': {}.{} must be [\"token\", id] with an id in the vocabulary",
               file.string(), field, key);
      return v[1].get<int32_t>();
    };
    const int32_t cls = token("cls"), sep = token("sep");
    using P = TemplatePiece;
    t.single = {{P::kSpecial, 0, {cls}}, {P::kA, 0, {}}, {P::kSpecial, 0, {sep}}};
    if (roberta)
      t.pair = {{P::kSpecial, 0, {cls}},
                {P::kA, 0, {}},
                {P::kSpecial, 0, {sep, sep}},
                {P::kB, 0, {}},
                {P::kSpecial, 0, {sep}}};
    else
      t.pair = {{P::kSpecial, 0, {cls}},
                {P::kA, 0, {}},
                {P::kSpecial, 0, {sep}},
                {P::kB, 1, {}},
                {P::kSpecial, 1, {sep}}};
    return;
  }
  check_keys(j, {"type", "single", "pair", "special_tokens"}, field, file, loader);
  const ojson& specials = j.value("special_tokens", ojson::object());
  DS_CHECK(specials.is_object(), "[tokenizer] '{}': {}.special_tokens must be an object",
           file.string(), field);
  for (const auto& [name, s] : specials.items())
    check_keys(s, {"id", "ids", "tokens"}, fmt::format("{}.special_tokens['{}']", field, name),
               file, loader);
  t.single = parse_template(j.value("single", ojson()), specials, field + ".single", file, false,
                            vocab_size, loader);
  t.pair = parse_template(j.value("pair", ojson()), specials, field + ".pair", file, true,
                          vocab_size, loader);
  t.template_types = true;
}

}  // namespace

PairTemplate parse_post_processor(const ojson& j, int32_t vocab_size, const fs::path& file,
                                  std::string_view loader,
                                  const std::vector<std::string_view>& accepted) {
  PairTemplate t;
  if (!j.is_null()) parse_into(t, j, "post_processor", vocab_size, file, loader, accepted);
  return t;
}

PairEncoding PairTemplate::apply(std::span<const int32_t> a, const std::span<const int32_t>* b,
                                 bool specials) const {
  PairEncoding out;
  auto append = [&](std::span<const int32_t> ids, uint32_t type_id) {
    out.ids.insert(out.ids.end(), ids.begin(), ids.end());
    out.type_ids.insert(out.type_ids.end(), ids.size(), type_id);
  };
  const std::vector<TemplatePiece>& tmpl = b ? pair : single;
  if (tmpl.empty() || (!specials && !template_types)) {
    append(a, 0);
    if (b) append(*b, 1);
    return out;
  }
  for (const TemplatePiece& p : tmpl) {
    if (!specials && p.kind == TemplatePiece::kSpecial) continue;
    append(p.kind == TemplatePiece::kA   ? a
           : p.kind == TemplatePiece::kB ? *b
                                         : std::span<const int32_t>(p.ids),
           p.type_id);
  }
  return out;
}

void PairTemplate::encode_single(
    const std::function<void(std::vector<int32_t>&, std::vector<TokenSpan>*)>& encode_sequence,
    std::vector<int32_t>& ids, std::vector<TokenSpan>* spans) const {
  if (empty()) {
    encode_sequence(ids, spans);
    return;
  }
  const size_t before = spans ? spans->size() : 0;
  uint32_t end = 0;  // where the sequence's spans end, for the specials after it
  for (const TemplatePiece& p : single) {
    if (p.kind == TemplatePiece::kA) {
      encode_sequence(ids, spans);
      end = spans && spans->size() > before ? spans->back().end : 0;
      continue;
    }
    for (int32_t id : p.ids) {
      ids.push_back(id);
      if (spans) spans->push_back({end, end});
    }
  }
}

}  // namespace ds::data::detail
