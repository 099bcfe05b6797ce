// The Hugging Face weights path shared by every kind of model (hf_weights.h).
#include "hf_weights.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ds/autograd/grad_mode.h"
#include "ds/core/error.h"
#include "ds/core/json_text.h"
#include "ds/ops/ops.h"

namespace ds::models::detail {

namespace fs = std::filesystem;
using nlohmann::json;

// Index of the first NaN or Inf of a contiguous floating-point tensor (f32, bf16, f16), or -1.
// Tested by exponent bits (all ones), a block at a time so the common all-finite case vectorises.
int64_t first_non_finite(const Tensor& t) {
  const int64_t n = t.numel();
  auto scan = [n](const auto* p, auto mask) -> int64_t {
    constexpr int64_t kBlock = 4096;
    for (int64_t b = 0; b < n; b += kBlock) {
      const int64_t e = std::min(n, b + kBlock);
      bool any = false;
      for (int64_t i = b; i < e; ++i) any |= (p[i] & mask) == mask;
      if (!any) continue;
      for (int64_t i = b; i < e; ++i)
        if ((p[i] & mask) == mask) return i;
    }
    return -1;
  };
  switch (t.dtype()) {
    case DType::f32:
      return scan(static_cast<const uint32_t*>(t.raw_data()), uint32_t{0x7F800000});
    case DType::bf16:
      return scan(static_cast<const uint16_t*>(t.raw_data()), uint16_t{0x7F80});
    case DType::f16:
      return scan(static_cast<const uint16_t*>(t.raw_data()), uint16_t{0x7C00});
    default:
      return -1;
  }
}

// The safetensors files of a folder or the file itself.
std::vector<fs::path> weight_files(const fs::path& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return {path};
  DS_CHECK(fs::is_directory(path, ec),
           "[hf_io] '{}' does not exist; --init_from takes a Hugging Face model folder "
           "(config.json + model.safetensors) or a .safetensors file",
           path.string());
  if (fs::is_regular_file(path / "model.safetensors")) return {path / "model.safetensors"};
  const fs::path index = path / "model.safetensors.index.json";
  if (fs::is_regular_file(index)) {
    std::ifstream in(index);
    json j;
    try {
      j = json::parse(in);
    } catch (const json::exception& e) {
      DS_THROW("[hf_io] {}: not valid JSON ({})", index.string(), e.what());
    }
    DS_CHECK(j.contains("weight_map") && j["weight_map"].is_object(),
             "[hf_io] {}: no \"weight_map\" object", index.string());
    std::set<std::string> names;
    for (const auto& [k, v] : j["weight_map"].items()) {
      // Shards are files of this folder (model-00001-of-00002.safetensors). A name with a path in
      // it ("../x", "/etc/x", "sub/x") would read a file outside the model folder: refuse it. A
      // shard that is a symbolic link (the Hugging Face cache's blobs) is still fine.
      const std::string name = v.is_string() ? v.get<std::string>() : std::string();
      DS_CHECK(v.is_string() && !name.empty() && name != "." && name != ".." &&
                   name.find_first_of("/\\") == std::string::npos && name.find('\0') == std::string::npos,
               "[hf_io] {}: weight_map[\"{}\"] = {} is not a file name in the model folder (shards "
               "must sit beside the index, without a path); the index is damaged or not from "
               "save_pretrained: fix or re-export it",
               index.string(), k, json_show(v));
      names.insert(name);
    }
    std::vector<fs::path> out;
    for (const auto& n : names) out.push_back(path / n);
    return out;
  }
  std::vector<std::string> seen;
  for (const auto& e : fs::directory_iterator(path)) seen.push_back(e.path().filename().string());
  std::sort(seen.begin(), seen.end());
  const bool has_bin = std::find(seen.begin(), seen.end(), "pytorch_model.bin") != seen.end();
  DS_THROW(
      "[hf_io] {}: no model.safetensors or model.safetensors.index.json (the folder holds: {}){}",
      path.string(),
      seen.empty() ? std::string("nothing") : fmt::format("{}", fmt::join(seen, ", ")),
      has_bin ? "; pytorch_model.bin is a pickle, which is not read here: convert it with "
                "transformers (model.save_pretrained(dir, safe_serialization=True))"
              : "");
}

void write_text_atomic(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    DS_CHECK(out.good(), "[hf_io] cannot write '{}'", tmp.string());
    out << text;
    out.flush();
    if (!out.good()) {
      out.close();
      fs::remove(tmp, ec);  // a full disk must not leave the temporary behind
      DS_THROW("[hf_io] write to '{}' failed (disk full?)", tmp.string());
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    DS_THROW("[hf_io] cannot rename '{}' to '{}': {}", tmp.string(), path.string(), why);
  }
}


const char* hf_dtype_name(DType dtype) {
  return dtype == DType::bf16 ? "bfloat16" : dtype == DType::f16 ? "float16" : "float32";
}

namespace {

std::string key_of(const std::string& prefix, const std::string& name) {
  return !prefix.empty() && name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name;
}

// Targets grouped by the file tensor holding them, in the order of their first part; the parts of
// a stacked tensor in part order.
struct Group {
  HFPlace place;                     // of part 0 (name, parts, transposed)
  std::vector<const Target*> parts;  // part order
  bool optional = false;
};

std::vector<Group> group_by_file_tensor(const std::vector<Target>& targets) {
  std::vector<Group> groups;
  std::map<std::string, size_t> index;
  for (const Target& t : targets) {
    const HFPlace& p = t.place;
    DS_CHECK(p.parts >= 1 && p.part >= 0 && p.part < p.parts && (p.parts == 1 || !p.transposed),
             "[hf_io] internal: '{}' is placed as part {} of {}", t.ours, p.part, p.parts);
    auto [it, fresh] = index.emplace(p.name, groups.size());
    if (fresh) groups.push_back({p, std::vector<const Target*>(static_cast<size_t>(p.parts)), false});
    Group& g = groups[it->second];
    DS_CHECK(g.place.parts == p.parts && g.parts[static_cast<size_t>(p.part)] == nullptr,
             "[hf_io] internal: two tensors are placed at part {} of '{}'", p.part, p.name);
    g.parts[static_cast<size_t>(p.part)] = &t;
    g.optional = g.optional || t.optional;
  }
  for (const Group& g : groups)
    for (size_t i = 0; i < g.parts.size(); ++i)
      DS_CHECK(g.parts[i] != nullptr, "[hf_io] internal: part {} of '{}' is not ours", i,
               g.place.name);
  return groups;
}

// The file shape of a group: the tensor's (swapped when transposed), or the parts' rows stacked.
Shape file_shape(const Group& g) {
  Shape s = g.parts[0]->tensor.shape();
  if (g.place.transposed) std::swap(s[0], s[1]);
  for (size_t i = 1; i < g.parts.size(); ++i) s[0] += g.parts[i]->tensor.size(0);
  return s;
}

FileIndex index_file_tensors(const std::string& prefix,
                             const std::vector<safetensors::Reader>& readers,
                             std::vector<std::string>& problems) {
  FileIndex by_key;
  for (const auto& r : readers)
    for (const auto& e : r.entries()) {
      const std::string key = key_of(prefix, e.name);
      auto [it, inserted] = by_key.emplace(key, FileTensor{&r, &e});
      if (!inserted)
        problems.push_back(
            it->second.entry->name == e.name
                ? fmt::format("duplicate: '{}'", e.name)
                : fmt::format("duplicate: '{}' and '{}' are the same tensor '{}'",
                              it->second.entry->name, e.name, key));
    }
  return by_key;
}

// The file tensor of group `g`, or the problem with it (missing, mis-shaped, unsupported dtype).
std::optional<FileTensor> match_group(const Group& g, const ImportRules& rules,
                                      const FileIndex& by_key, std::set<std::string>& used,
                                      ImportReport& report, std::vector<std::string>& problems) {
  const Shape want = file_shape(g);
  const std::string key = key_of(rules.prefix, g.place.name);
  auto it = by_key.find(key);
  if (it == by_key.end()) {
    if (g.optional)
      for (const Target* t : g.parts) report.missing.push_back(t->ours);
    else
      problems.push_back(fmt::format("missing: '{}' {}", g.place.name, shape_str(want)));
    return std::nullopt;
  }
  used.insert(key);
  const safetensors::Entry& e = *it->second.entry;
  if (e.shape != want) {
    std::string note;
    if (g.place.transposed) note = " (Conv1D layout: (in, out))";
    if (g.parts.size() > 1) {
      std::vector<std::string> names;
      for (const Target* t : g.parts) names.push_back(t->ours + " " + shape_str(t->tensor.shape()));
      note = fmt::format(" (our {} stacked)", fmt::join(names, " and "));
    }
    if (rules.shape_note && g.parts.size() == 1) note += rules.shape_note(*g.parts[0], e.shape);
    problems.push_back(fmt::format("mis-shaped: '{}' is {} in the file, the model needs {}{}",
                                   e.name, shape_str(e.shape), shape_str(want), note));
    return std::nullopt;
  }
  if (!e.supported) {
    problems.push_back(fmt::format("unsupported dtype: '{}' is {} (F32, BF16 and F16 are read)",
                                   e.name, e.dtype_name));
    return std::nullopt;
  }
  return it->second;
}

// Group `g`'s tensors from its file tensor (split into its parts, transposed back), each checked
// for non-finite values after the copy.
void copy_group(const Group& g, const FileTensor& found, ImportReport& report) {
  Tensor t = found.read();
  if (g.place.transposed) {
    t = ops::transpose(t, 0, 1);
    ++report.transposed;
  }
  int64_t row = 0;
  for (const Target* target : g.parts) {
    const Tensor& dst = target->tensor;
    const int64_t rows = dst.size(0);
    const Tensor part = g.parts.size() == 1 ? t : ops::slice(t, 0, row, row + rows);
    row += rows;
    dst.detach().copy_from(part);
    // A NaN or Inf in the weights (a checkpoint saved after training diverged, or a damaged file)
    // would otherwise surface as "!!!!!!" from ds_generate or a loss blamed on the learning rate.
    // Checked after the copy, so a value the model's dtype cannot hold counts too.
    const int64_t bad = first_non_finite(dst.detach());
    DS_CHECK(bad < 0,
             "[hf_io] {}: tensor '{}'{} holds a non-finite value (NaN or Inf) at element {} of "
             "{}{}; these weights cannot be used: take an earlier checkpoint, or check how this "
             "file was written",
             found.reader->path(), found.entry->name,
             g.parts.size() > 1 ? fmt::format(" (its part {})", target->ours) : std::string(), bad,
             dst.numel(),
             dst.dtype() != found.entry->dtype
                 ? fmt::format(" (after conversion from {} to {})", found.entry->dtype_name,
                               dtype_name(dst.dtype()))
                 : std::string());
    ++report.tensors;
  }
}

}  // namespace

ImportReport import_weights(const fs::path& path, const std::vector<Target>& targets,
                            const ImportRules& rules) {
  ImportReport report;
  std::vector<safetensors::Reader> readers;
  for (const auto& f : weight_files(path)) {
    DS_CHECK(fs::is_regular_file(f), "[hf_io] '{}' (named by the index) does not exist",
             f.string());
    readers.emplace_back(f.string());
    report.files.push_back(f.string());
  }
  const std::string where = report.files.size() == 1 ? report.files[0] : path.string();
  std::vector<std::string> problems;
  const FileIndex by_key = index_file_tensors(rules.prefix, readers, problems);
  std::set<std::string> used;
  const std::vector<Group> groups = group_by_file_tensor(targets);
  std::vector<std::pair<const Group*, FileTensor>> plan;
  for (const Group& g : groups)
    if (auto found = match_group(g, rules, by_key, used, report, problems))
      plan.emplace_back(&g, *found);
  for (const auto& [key, found] : by_key) {
    if (used.count(key) || rules.elsewhere.count(key)) continue;
    const Unused u = rules.unused ? rules.unused(key, found, by_key) : Unused{};
    if (u.kind == Unused::ignored)
      report.ignored.push_back(found.entry->name);
    else if (u.kind == Unused::problem)
      problems.push_back(u.text);
    else
      problems.push_back(fmt::format("extra: '{}' {} is not a parameter of this model{}",
                                     found.entry->name, shape_str(found.entry->shape), u.text));
  }
  if (!problems.empty())
    DS_THROW("[hf_io] {}: {} problem{} loading weights into {}:\n  {}\n{}", where,
             problems.size(), problems.size() == 1 ? "" : "s", rules.describe,
             fmt::join(problems, "\n  "), rules.advice);
  autograd::NoGradGuard no_grad;
  for (const auto& [group, found] : plan) copy_group(*group, found, report);
  return report;
}

std::vector<std::pair<std::string, Tensor>> export_tensors(
    const std::vector<std::pair<std::string, Tensor>>& named,
    const std::function<HFPlace(const std::string& ours)>& place, DType dtype) {
  std::vector<Target> targets;
  targets.reserve(named.size());
  for (const auto& [ours, t] : named) {
    DS_CHECK(t.defined(), "[hf_io] export: '{}' has no tensor", ours);
    targets.push_back({ours, t, place(ours)});
  }
  autograd::NoGradGuard no_grad;
  std::vector<std::pair<std::string, Tensor>> out;
  for (const Group& g : group_by_file_tensor(targets)) {
    std::vector<Tensor> parts;
    for (const Target* t : g.parts) parts.push_back(t->tensor.detach());
    Tensor t = parts.size() == 1 ? parts[0] : ops::concat(parts, 0);
    if (g.place.transposed) t = ops::transpose(t, 0, 1).contiguous();
    out.emplace_back(g.place.name, t.contiguous().to(dtype));
  }
  return out;
}

void write_hf_folder(const fs::path& dir, const std::vector<std::pair<std::string, Tensor>>& tensors,
                     json config, DType dtype) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  DS_CHECK(!ec, "[hf_io] cannot create '{}': {}", dir.string(), ec.message());
  // transformers refuses a safetensors file without format metadata.
  safetensors::save((dir / "model.safetensors").string(), tensors, {{"format", "pt"}});
  config["dtype"] = hf_dtype_name(dtype);
  write_text_atomic(dir / "config.json", config.dump(2) + "\n");
}

}  // namespace ds::models::detail
