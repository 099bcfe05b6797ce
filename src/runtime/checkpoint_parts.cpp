// Slices of whole parameters in model-parallel checkpoints (checkpoint_parts.h).
#include "checkpoint_parts.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <functional>

#include "ds/core/error.h"
#include "ds/nn/expert_parallel.h"

namespace ds::runtime::detail {
namespace {

// Whole coordinates [begin, end) of one dimension held at local index `local` onwards.
struct Interval {
  int64_t begin = 0, end = 0, local = 0;
};

std::vector<Interval> intervals(const Slice& s, size_t d) {
  if (static_cast<int>(d) != s.dim) return {{0, s.full[d], 0}};
  const int64_t per = s.full[d] / s.blocks, len = s.end - s.begin;
  std::vector<Interval> out;
  for (int64_t j = 0; j < s.blocks; ++j)
    if (len > 0) out.push_back({j * per + s.begin, j * per + s.end, j * len});
  return out;
}

// Per dimension: (src local, dst local, length) of the whole coordinates both hold, ascending.
struct Common {
  int64_t src = 0, dst = 0, len = 0;
};

std::vector<Common> common(const Slice& a, const Slice& b, size_t d) {
  std::vector<Common> out;
  for (const Interval& x : intervals(a, d))
    for (const Interval& y : intervals(b, d)) {
      const int64_t lo = std::max(x.begin, y.begin), hi = std::min(x.end, y.end);
      if (lo < hi) out.push_back({x.local + (lo - x.begin), y.local + (lo - y.begin), hi - lo});
    }
  std::sort(out.begin(), out.end(), [](const Common& p, const Common& q) { return p.dst < q.dst; });
  return out;
}

std::vector<int64_t> strides(const Shape& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) s[d - 1] = s[d] * shape[d];
  return s;
}

}  // namespace

Slice Slice::of(const Shape& local, const nn::TPSplit& split) {
  if (split.replicated()) return whole(local);
  Shape full = local;
  full.at(static_cast<size_t>(split.dim)) = split.full;
  return Slice{full, split.dim, split.blocks, split.begin, split.end};
}

Shape Slice::local_shape() const {
  Shape s = full;
  if (dim >= 0) s[static_cast<size_t>(dim)] = blocks * (end - begin);
  return s;
}

int64_t Slice::local_numel() const {
  int64_t n = 1;
  for (int64_t d : local_shape()) n *= d;
  return n;
}

nlohmann::json Slice::to_json() const {
  nlohmann::json j = {{"shape", full}};
  if (dim >= 0) {
    j["dim"] = dim;
    j["blocks"] = blocks;
    j["begin"] = begin;
    j["end"] = end;
  }
  return j;
}

Slice Slice::from_json(const nlohmann::json& j, const std::string& file, const std::string& where,
                       const char* tag) {
  auto bad = [&](const std::string& what) {
    std::string shown = j.dump();
    if (shown.size() > 80) shown = shown.substr(0, 77) + "...";
    DS_THROW("{} {}: {} is {}: {}; the checkpoint is damaged or not written by deepspeed.cpp", tag,
             file, where, shown, what);
  };
  if (!j.is_object() || !j.contains("shape") || !j["shape"].is_array())
    bad("expected an object with the whole tensor's \"shape\"");
  Slice s;
  for (const auto& d : j["shape"]) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) bad("the shape must be integers >= 0");
    s.full.push_back(d.get<int64_t>());
  }
  if (!j.contains("dim")) return s;
  auto integer = [&](const char* key) {
    if (!j.contains(key) || !j[key].is_number_integer())
      bad(fmt::format("a cut part needs an integer \"{}\"", key));
    return j[key].get<int64_t>();
  };
  const int64_t dim = integer("dim");
  s.blocks = integer("blocks");
  s.begin = integer("begin");
  s.end = integer("end");
  if (dim < 0 || dim >= static_cast<int64_t>(s.full.size())) bad("\"dim\" is not a dimension");
  s.dim = static_cast<int>(dim);
  const int64_t n = s.full[static_cast<size_t>(dim)];
  if (s.blocks < 1 || n % s.blocks != 0) bad("\"blocks\" must divide the cut dimension");
  if (s.begin < 0 || s.begin > s.end || s.end > n / s.blocks)
    bad("[begin, end) must lie inside one block of the cut dimension");
  return s;
}

std::string Slice::str() const {
  if (dim < 0) return fmt::format("whole {}", shape_str(full));
  return fmt::format("[{}, {}) of dimension {}{} of {}", begin, end, dim,
                     blocks > 1 ? fmt::format(" in each of {} blocks", blocks) : "",
                     shape_str(full));
}

std::vector<Run> overlap_runs(const Slice& src, const Slice& dst) {
  DS_CHECK(src.full == dst.full, "[checkpoint] internal: slices of different tensors {} and {}",
           shape_str(src.full), shape_str(dst.full));
  std::vector<Run> runs;
  const size_t rank = src.full.size();
  if (rank == 0) return {{0, 0, 1}};
  std::vector<std::vector<Common>> per_dim(rank);
  for (size_t d = 0; d < rank; ++d) {
    per_dim[d] = common(src, dst, d);
    if (per_dim[d].empty()) return runs;
  }
  const std::vector<int64_t> ss = strides(src.local_shape()), ds = strides(dst.local_shape());
  auto emit = [&](int64_t s, int64_t t, int64_t n) {
    if (!runs.empty() && runs.back().src + runs.back().len == s &&
        runs.back().dst + runs.back().len == t) {
      runs.back().len += n;
    } else {
      runs.push_back({s, t, n});
    }
  };
  std::function<void(size_t, int64_t, int64_t)> walk = [&](size_t d, int64_t so, int64_t to) {
    for (const Common& c : per_dim[d]) {
      if (d + 1 == rank) {
        emit(so + c.src, to + c.dst, c.len);
        continue;
      }
      for (int64_t k = 0; k < c.len; ++k)
        walk(d + 1, so + (c.src + k) * ss[d], to + (c.dst + k) * ds[d]);
    }
  };
  walk(0, 0, 0);
  return runs;
}

int64_t overlap_numel(const Slice& a, const Slice& b) {
  if (a.full != b.full) return 0;
  int64_t n = 1;
  for (size_t d = 0; d < a.full.size(); ++d) {
    int64_t along = 0;
    for (const Common& c : common(a, b, d)) along += c.len;
    n *= along;
  }
  return n;
}

std::map<std::string, std::vector<Source>> plan_sources(const std::vector<PartIndex>& parts,
                                                        const std::string& folder,
                                                        const char* tag) {
  std::map<std::string, std::vector<Source>> out;
  std::map<std::string, std::vector<std::vector<std::string>>> holders;  // files per distinct slice
  for (size_t k = 0; k < parts.size(); ++k)
    for (const auto& [name, slice] : parts[k].slices) {
      std::vector<Source>& v = out[name];
      if (!v.empty())
        DS_CHECK(v.front().slice.full == slice.full,
                 "{} {}: parameter {} is whole {} in {} but whole {} in {}: the parts were written "
                 "by different models; use the files of one save only",
                 tag, folder, name, shape_str(v.front().slice.full), parts[v.front().part].file,
                 shape_str(slice.full), parts[k].file);
      auto& files = holders[name];
      const auto seen =
          std::find_if(v.begin(), v.end(), [&](const Source& s) { return s.slice == slice; });
      if (seen == v.end()) {
        v.push_back({k, slice});
        files.push_back({parts[k].file});
      } else {
        files[static_cast<size_t>(seen - v.begin())].push_back(parts[k].file);
      }
    }
  for (const auto& [name, v] : out) {
    int64_t whole = 1, held = 0;
    for (int64_t d : v.front().slice.full) whole *= d;
    for (size_t i = 0; i < v.size(); ++i) {
      held += v[i].slice.local_numel();
      for (size_t j = 0; j < i; ++j)
        DS_CHECK(overlap_numel(v[i].slice, v[j].slice) == 0,
                 "{} {}: parameter {}: {} holds {} and {} holds {}: the slices overlap; the "
                 "parts were written by different runs or layouts; use the files of one save only",
                 tag, folder, name, parts[v[j].part].file, v[j].slice.str(), parts[v[i].part].file,
                 v[i].slice.str());
    }
    if (held != whole) {
      std::vector<std::string> have;
      const auto& files = holders.at(name);
      for (size_t i = 0; i < v.size(); ++i)
        have.push_back(fmt::format("{} in {}", v[i].slice.str(), fmt::join(files[i], ", ")));
      DS_THROW(
          "{} {}: parameter {} (whole {}) is held only in part: {} ({} of its {} elements); "
          "a part file of this checkpoint is missing or damaged",
          tag, folder, name, shape_str(v.front().slice.full), fmt::join(have, "; "), held, whole);
    }
  }
  return out;
}

std::string model_file_name(int mp_rank, int ep_rank) {
  return fmt::format("{}mp_rank_{:02d}_model_states.safetensors",
                     ep_rank > 0 ? fmt::format("expp_rank_{}_", ep_rank) : "", mp_rank);
}

std::string optim_file_name(bool bf16, int dp_rank, int mp_rank, int ep_rank) {
  return fmt::format("{}{}zero_pp_rank_{}_mp_rank_{:02d}_optim_states.safetensors",
                     ep_rank > 0 ? fmt::format("expp_rank_{}_", ep_rank) : "",
                     bf16 ? "bf16_" : "", dp_rank, mp_rank);
}

namespace {

// Reads decimal digits at `at`; advances it. nullopt when there are none (or too many).
std::optional<int> digits(const std::string& s, size_t& at) {
  size_t end = at;
  while (end < s.size() && end - at < 9 && std::isdigit(static_cast<unsigned char>(s[end]))) ++end;
  if (end == at || (end < s.size() && std::isdigit(static_cast<unsigned char>(s[end]))))
    return std::nullopt;
  const int v = std::stoi(s.substr(at, end - at));
  at = end;
  return v;
}

bool take(const std::string& s, size_t& at, std::string_view word) {
  if (s.compare(at, word.size(), word) != 0) return false;
  at += word.size();
  return true;
}

}  // namespace

namespace {

// "expp_rank_E_" at `at` (advanced past it): E > 0; 0 when absent; nullopt when malformed.
std::optional<int> expert_prefix(const std::string& name, size_t& at) {
  if (!take(name, at, "expp_rank_")) return 0;
  const auto ep = digits(name, at);
  if (!ep || *ep == 0 || !take(name, at, "_")) return std::nullopt;
  return ep;
}

}  // namespace

std::optional<FileRanks> parse_model_file_name(const std::string& name) {
  size_t at = 0;
  const auto ep = expert_prefix(name, at);
  if (!ep || !take(name, at, "mp_rank_")) return std::nullopt;
  const auto mp = digits(name, at);
  if (!mp || !take(name, at, "_model_states.safetensors") || at != name.size()) return std::nullopt;
  return FileRanks{0, *mp, *ep};
}

std::optional<FileRanks> parse_optim_file_name(const std::string& name, bool bf16) {
  size_t at = 0;
  const auto ep = expert_prefix(name, at);
  if (!ep) return std::nullopt;
  if (bf16 && !take(name, at, "bf16_")) return std::nullopt;
  if (!take(name, at, "zero_pp_rank_")) return std::nullopt;
  const auto dp = digits(name, at);
  if (!dp || !take(name, at, "_mp_rank_")) return std::nullopt;
  const auto mp = digits(name, at);
  if (!mp || !take(name, at, "_optim_states.safetensors") || at != name.size()) return std::nullopt;
  return FileRanks{*dp, *mp, *ep};
}

std::map<std::string, nn::TPSplit> part_splits(const nn::Module& model, bool model_parallel) {
  std::map<std::string, nn::TPSplit> splits;
  if (model_parallel) splits = nn::tp_splits(model);
  for (const auto& [name, e] : nn::expert_splits(model))
    splits[name] = nn::TPSplit{.dim = 0, .full = e.full, .blocks = 1, .begin = e.begin, .end = e.end};
  return splits;
}

void copy_runs(const std::vector<Run>& runs, const void* src, void* dst, size_t es) {
  const auto* s = static_cast<const unsigned char*>(src);
  auto* d = static_cast<unsigned char*>(dst);
  for (const Run& r : runs)
    std::memcpy(d + static_cast<size_t>(r.dst) * es, s + static_cast<size_t>(r.src) * es,
                static_cast<size_t>(r.len) * es);
}

}  // namespace ds::runtime::detail
