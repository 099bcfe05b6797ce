// An optimizer shard's ds_optimizer metadata, read and checked: see optimizer_shard.h.
#include "optimizer_shard.h"

#include "checkpoint_format.h"
#include "ds/core/error.h"

namespace ds::runtime::detail {

using Use = CheckpointReader::Use;

namespace {

const nlohmann::json& field_array(const nlohmann::json& j, const std::string& key,
                                  const std::string& file, const std::string& where) {
  auto it = j.find(key);
  DS_CHECK(it != j.end() && it->is_array(),
           "[ds_to_fp32] {}: {}.{} must be an array; the checkpoint is damaged or not written by "
           "deepspeed.cpp",
           file, where, key);
  return *it;
}

}  // namespace

ShardMeta read_shard_meta(const safetensors::Reader& r, Use use, int64_t stored) {
  const bool resume = use == Use::Resume;
  ShardMeta m;
  m.file = r.path();
  const std::string& path = m.file;
  m.json = parse_metadata(r, "ds_optimizer", resume ? "[checkpoint]" : "[ds_to_fp32]");
  const Meta meta(m.json, path, "ds_optimizer");
  if (resume) {
    m.numel = meta.integer("numel");
    m.names = meta.array("param_names");
    m.shapes = meta.array("param_shapes");
    m.offsets = meta.array("param_offsets");
    DS_CHECK(m.shapes.size() == m.names.size() && m.offsets.size() == m.names.size(),
             "[checkpoint] {}: ds_optimizer lists {} parameter names, {} shapes and {} offsets; "
             "the file is damaged",
             path, m.names.size(), m.shapes.size(), m.offsets.size());
    m.slices = nlohmann::json::array();
    if (meta.has("param_slices")) {
      m.slices = meta.array("param_slices");
      DS_CHECK(m.slices.size() == m.names.size(),
               "[checkpoint] {}: ds_optimizer lists {} parameter names but {} slices; the file "
               "is damaged",
               path, m.names.size(), m.slices.size());
    }
    m.partition_count = meta.has("partition_count") ? meta.integer("partition_count", 1) : 1;
  } else {
    m.numel = field_int(m.json, "numel", path, "ds_optimizer");
    m.partition_count = field_int(m.json, "partition_count", path, "ds_optimizer");
    m.rank = field_int(m.json, "rank", path, "ds_optimizer");
    m.names = field_array(m.json, "param_names", path, "ds_optimizer");
    m.shapes = field_array(m.json, "param_shapes", path, "ds_optimizer");
    m.offsets = field_array(m.json, "param_offsets", path, "ds_optimizer");
    m.slices = m.json.contains("param_slices")
                   ? field_array(m.json, "param_slices", path, "ds_optimizer")
                   : nlohmann::json::array();
    DS_CHECK(m.names.size() == m.shapes.size() && m.names.size() == m.offsets.size() &&
                 (m.slices.empty() || m.slices.size() == m.names.size()),
             "[ds_to_fp32] {}: ds_optimizer lists {} names, {} shapes, {} offsets and {} slices; "
             "the file is damaged",
             path, m.names.size(), m.shapes.size(), m.offsets.size(), m.slices.size());
  }
  const nlohmann::json& segments =
      resume ? meta.array("segments") : field_array(m.json, "segments", path, "ds_optimizer");
  for (const auto& seg : segments) {
    bool ok = seg.is_array() && seg.size() == 3;
    for (size_t k = 0; ok && k < 3; ++k)
      ok = seg[k].is_number_integer() && seg[k].get<int64_t>() >= 0;
    if (!ok && resume)
      meta.bad("segments[]", seg, "a list of [flat begin, flat end, offset] integer triples >= 0");
    DS_CHECK(ok,
             "[ds_to_fp32] {}: ds_optimizer.segments holds {}, expected [flat begin, flat "
             "end, offset] triples of integers >= 0; the file is damaged",
             path, seg.dump());
    const int64_t fb = seg[0].get<int64_t>(), fe = seg[1].get<int64_t>(),
                  off = seg[2].get<int64_t>();
    if (resume)
      DS_CHECK(fb <= fe && fe <= m.numel,
               "[checkpoint] {}: segment [{}, {}) lies outside the {} flat elements; the file is "
               "damaged",
               path, fb, fe, m.numel);
    else
      DS_CHECK(fb <= fe && fe <= m.numel && (stored < 0 || off + (fe - fb) <= stored),
               "[ds_to_fp32] {}: segment [{}, {}) at offset {} lies outside the {} flat "
               "elements or the {} stored ones; the file is damaged",
               path, fb, fe, off, m.numel, stored);
    if (fb < fe) m.segments.push_back({fb, fe, off});
  }
  return m;
}

const float* shard_tensor(const safetensors::Reader& r, const std::string& name, Use use,
                          int64_t* count) {
  if (use == Use::Resume) {
    DS_CHECK(r.contains(name), "[checkpoint] {} has no optimizer state '{}'", r.path(), name);
  } else {
    DS_CHECK(r.contains(name), "[ds_to_fp32] {} has no '{}' tensor; the file is damaged", r.path(),
             name);
  }
  const safetensors::Entry& e = r.entry(name);
  if (use == Use::Resume) {
    DS_CHECK(e.supported && e.dtype == DType::f32, "[checkpoint] {}: '{}' is not fp32", r.path(),
             name);
  } else {
    DS_CHECK(e.supported && e.dtype == DType::f32,
             "[ds_to_fp32] {}: '{}' is {}, expected F32; the file is damaged", r.path(), name,
             e.dtype_name);
  }
  *count = static_cast<int64_t>((e.end - e.begin) / sizeof(float));
  return reinterpret_cast<const float*>(r.data_of(e));
}

std::vector<ShardParameter> shard_parameters(const ShardMeta& m, Use use) {
  const bool resume = use == Use::Resume;
  const char* tag = resume ? "[checkpoint]" : "[ds_to_fp32]";
  const std::string& path = m.file;
  const Meta meta(m.json, path, "ds_optimizer");
  std::vector<ShardParameter> out;
  for (size_t i = 0; i < m.names.size(); ++i) {
    const nlohmann::json &name = m.names[i], &shape = m.shapes[i], &offset = m.offsets[i];
    ShardParameter p;
    // The shape's dimensions, while they are integers >= 0.
    bool shape_ok = shape.is_array();
    int64_t count = 1;
    for (const auto& d : shape) {
      shape_ok = shape_ok && d.is_number_integer() && d.get<int64_t>() >= 0;
      if (shape_ok) count *= d.get<int64_t>();
    }
    if (resume) {
      if (!name.is_string()) meta.bad(fmt::format("param_names[{}]", i), name, "a string");
      if (!shape_ok) meta.bad(fmt::format("param_shapes[{}]", i), shape, "a list of integers >= 0");
      if (!offset.is_number_integer() || offset.get<int64_t>() < 0 ||
          offset.get<int64_t>() + count > m.numel)
        meta.bad(fmt::format("param_offsets[{}]", i), offset,
                 fmt::format("an offset inside the {} flat elements", m.numel));
    } else {
      DS_CHECK(
          name.is_string() && shape_ok && offset.is_number_integer() && offset.get<int64_t>() >= 0,
          "[ds_to_fp32] {}: parameter {} of ds_optimizer (name, shape, offset) is "
          "malformed; the file is damaged",
          path, i);
    }
    p.name = name.get<std::string>();
    p.shape = shape.get<Shape>();
    p.offset = offset.get<int64_t>();
    p.numel = count;
    DS_CHECK(p.offset + p.numel <= m.numel,
             "[ds_to_fp32] {}: parameter {} [{}, {}) lies past the {} flat elements; the file "
             "is damaged",
             path, p.name, p.offset, p.offset + p.numel, m.numel);
    p.slice = Slice::whole(p.shape);
    if (!m.slices.empty()) {
      p.slice =
          Slice::from_json(m.slices[i], path, fmt::format("ds_optimizer.param_slices[{}]", i), tag);
      DS_CHECK(p.slice.local_shape() == p.shape,
               "{} {}: parameter {} is {} in the file, but its slice ({}) is {}; the file is "
               "damaged",
               tag, path, p.name, shape_str(p.shape), p.slice.str(),
               shape_str(p.slice.local_shape()));
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace ds::runtime::detail
