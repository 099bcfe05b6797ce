#include <algorithm>
#include "ds/core/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "ds/core/error.h"

namespace ds::safetensors {
namespace {

// The reference implementation refuses headers above 100 MB; a larger length is a corrupted file.
constexpr uint64_t kMaxHeader = 100u << 20;

struct DTypeName {
  const char* name;
  size_t size;
  bool supported;
  DType dtype;
};
// Ours first; the others are recognised so that a file holding them still opens.
constexpr DTypeName kDTypes[] = {
    {"F32", 4, true, DType::f32},     {"BF16", 2, true, DType::bf16},
    {"F16", 2, true, DType::f16},     {"I32", 4, true, DType::i32},
    {"I64", 8, true, DType::i64},     {"F64", 8, false, DType::f32},
    {"I8", 1, false, DType::f32},     {"U8", 1, false, DType::f32},
    {"BOOL", 1, false, DType::f32},   {"I16", 2, false, DType::f32},
    {"U16", 2, false, DType::f32},    {"U32", 4, false, DType::f32},
    {"U64", 8, false, DType::f32},    {"F8_E4M3", 1, false, DType::f32},
    {"F8_E5M2", 1, false, DType::f32}};

const DTypeName* find_dtype(const std::string& s) {
  for (const auto& d : kDTypes)
    if (s == d.name) return &d;
  return nullptr;
}

std::string errno_str() {
  return std::strerror(errno);
}

void write_all(int fd, const void* p, size_t n, const std::string& path) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    DS_CHECK(w > 0, "[safetensors] {}: write failed: {} (disk full?)", path, errno_str());
    c += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

const char* dtype_to_safetensors(DType t) {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
  }
  DS_THROW("[safetensors] unknown dtype {}", static_cast<int>(t));
}

// ---- reading ----

Reader::Reader(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DS_CHECK(fd >= 0, "[safetensors] {}: cannot open: {}", path, errno_str());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    DS_THROW("[safetensors] {}: cannot stat: {}", path, errno_str());
  }
  file_size_ = static_cast<size_t>(st.st_size);
  if (file_size_ < 8) {
    ::close(fd);
    DS_THROW(
        "[safetensors] {}: truncated: {} bytes, but a safetensors file starts with an 8-byte "
        "header length",
        path, file_size_);
  }
  void* p = ::mmap(nullptr, file_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file open
  DS_CHECK(p != MAP_FAILED, "[safetensors] {}: mmap failed: {}", path, errno_str());
  const size_t len = file_size_;
  map_ = std::shared_ptr<void>(p, [len](void* q) { ::munmap(q, len); });
  const auto* bytes = static_cast<const uint8_t*>(p);

  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];  // little-endian on any host
  DS_CHECK(n <= kMaxHeader,
           "[safetensors] {}: corrupted header: length {} exceeds the 100 MB limit "
           "(is this a safetensors file?)",
           path, n);
  DS_CHECK(n <= file_size_ - 8,
           "[safetensors] {}: truncated: the header needs {} bytes but only {} "
           "follow the length",
           path, n, file_size_ - 8);
  data_start_ = 8 + static_cast<size_t>(n);
  const size_t data_size = file_size_ - data_start_;

  nlohmann::ordered_json header;
  try {
    header = nlohmann::ordered_json::parse(bytes + 8, bytes + 8 + n);
  } catch (const std::exception& e) {
    DS_THROW("[safetensors] {}: corrupted header: not valid JSON ({})", path, e.what());
  }
  DS_CHECK(header.is_object(), "[safetensors] {}: corrupted header: expected a JSON object", path);
  try {
    for (const auto& [key, val] : header.items()) {
      if (key == "__metadata__") {
        DS_CHECK(val.is_object(),
                 "[safetensors] {}: corrupted header: __metadata__ is not an object", path);
        for (const auto& [mk, mv] : val.items()) {
          DS_CHECK(mv.is_string(),
                   "[safetensors] {}: corrupted header: metadata '{}' is not a string", path, mk);
          metadata_[mk] = mv.get<std::string>();
        }
        continue;
      }
      DS_CHECK(
          val.is_object() && val.contains("dtype") && val.contains("shape") &&
              val.contains("data_offsets"),
          "[safetensors] {}: corrupted header: tensor '{}' needs dtype, shape and data_offsets",
          path, key);
      Entry e;
      e.name = key;
      e.dtype_name = val.at("dtype").get<std::string>();
      const DTypeName* d = find_dtype(e.dtype_name);
      DS_CHECK(d, "[safetensors] {}: corrupted header: tensor '{}' has unknown dtype '{}'", path,
               key, e.dtype_name);
      e.supported = d->supported;
      e.dtype = d->dtype;
      uint64_t numel = 1;
      bool overflow = false;
      for (const auto& s : val.at("shape")) {
        const int64_t v = s.get<int64_t>();
        DS_CHECK(v >= 0, "[safetensors] {}: corrupted header: tensor '{}' has a negative dimension",
                 path, key);
        e.shape.push_back(v);
        overflow |= __builtin_mul_overflow(numel, static_cast<uint64_t>(v), &numel);
      }
      uint64_t nbytes = 0;
      overflow |= __builtin_mul_overflow(numel, static_cast<uint64_t>(d->size), &nbytes);
      DS_CHECK(!overflow, "[safetensors] {}: corrupted header: tensor '{}' of shape {} is too large",
               path, key, shape_str(e.shape));
      const auto& off = val.at("data_offsets");
      DS_CHECK(off.is_array() && off.size() == 2,
               "[safetensors] {}: corrupted header: data_offsets of '{}' must be [begin, end]",
               path, key);
      e.begin = off[0].get<uint64_t>();
      e.end = off[1].get<uint64_t>();
      DS_CHECK(
          e.begin <= e.end && e.end - e.begin == numel * d->size,
          "[safetensors] {}: corrupted header: tensor '{}' of shape {} {} spans bytes [{}, {}), "
          "expected {} bytes",
          path, key, shape_str(e.shape), e.dtype_name, e.begin, e.end, numel * d->size);
      DS_CHECK(e.end <= data_size,
               "[safetensors] {}: truncated: tensor '{}' ends at byte {} of the data but the file "
               "holds only {} data bytes",
               path, key, e.end, data_size);
      index_[e.name] = entries_.size();
      entries_.push_back(std::move(e));
    }
    check_layout(path, data_size);
  } catch (const nlohmann::json::exception& e) {
    DS_THROW("[safetensors] {}: corrupted header: {}", path, e.what());
  }
}

// The tensors must tile the data section: in offset order, each starts where the one before ends,
// the first at 0 and the last at the end of the file (as Python's safetensors requires: "invalid
// offset" / "incomplete metadata"). Otherwise two tensors could share bytes and one would load
// from the other's data.
void Reader::check_layout(const std::string& path, size_t data_size) const {
  std::vector<const Entry*> order;
  for (const auto& e : entries_) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t at = 0;
  const Entry* prev = nullptr;
  for (const Entry* e : order) {
    if (e->begin != at) {
      if (prev && e->begin < at)
        DS_THROW(
            "[safetensors] {}: invalid offset: tensor '{}' [{}, {}) overlaps tensor '{}' [{}, {}); "
            "the file is damaged or was written by a faulty tool: re-export it",
            path, e->name, e->begin, e->end, prev->name, prev->begin, prev->end);
      DS_THROW(
          "[safetensors] {}: invalid offset: tensor '{}' starts at byte {} of the data, but the "
          "bytes before it end at {} (a gap); the file is damaged or was written by a faulty "
          "tool: re-export it",
          path, e->name, e->begin, at);
    }
    at = e->end;
    prev = e;
  }
  DS_CHECK(at == data_size,
           "[safetensors] {}: incomplete metadata: the tensors cover {} bytes of data but the file "
           "holds {} (bytes no tensor describes); the file is damaged: re-export it",
           path, at, data_size);
}

Reader::~Reader() = default;
Reader::Reader(Reader&&) noexcept = default;
Reader& Reader::operator=(Reader&&) noexcept = default;

std::vector<std::string> Reader::names() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) out.push_back(e.name);
  return out;
}

bool Reader::contains(const std::string& name) const {
  return index_.count(name) != 0;
}

const Entry& Reader::entry(const std::string& name) const {
  auto it = index_.find(name);
  DS_CHECK(it != index_.end(), "[safetensors] {}: no tensor '{}' in the file ({} tensors)", path_,
           name, entries_.size());
  return entries_[it->second];
}

const std::string& Reader::metadata(const std::string& key) const {
  auto it = metadata_.find(key);
  DS_CHECK(it != metadata_.end(), "[safetensors] {}: no metadata key '{}'", path_, key);
  return it->second;
}

const uint8_t* Reader::data_of(const Entry& e) const {
  return static_cast<const uint8_t*>(map_.get()) + data_start_ + e.begin;
}

Tensor Reader::get(const std::string& name) const {
  const Entry& e = entry(name);
  DS_CHECK(e.supported,
           "[safetensors] {}: tensor '{}' has dtype {}, which deepspeed.cpp does not "
           "read (F32, BF16, F16, I32, I64)",
           path_, name, e.dtype_name);
  Tensor t = Tensor::empty(e.shape, e.dtype);
  if (e.end > e.begin) std::memcpy(t.raw_data(), data_of(e), e.end - e.begin);
  return t;
}

void Reader::read_into(const std::string& name, const Tensor& dst) const {
  const Entry& e = entry(name);
  DS_CHECK(e.shape == dst.shape(), "[safetensors] {}: tensor '{}' has shape {}, destination has {}",
           path_, name, shape_str(e.shape), shape_str(dst.shape()));
  DS_CHECK(e.supported,
           "[safetensors] {}: tensor '{}' has dtype {}, which deepspeed.cpp does not "
           "read (F32, BF16, F16, I32, I64)",
           path_, name, e.dtype_name);
  if (dst.is_contiguous()) {
    // Straight from the mapping into the destination, converting on the way.
    convert(data_of(e), e.dtype, dst.raw_data(), dst.dtype(), static_cast<size_t>(dst.numel()));
  } else {
    dst.copy_from(get(name));
  }
}

std::map<std::string, Tensor> load(const std::string& path) {
  Reader r(path);
  std::map<std::string, Tensor> out;
  for (const auto& e : r.entries())
    if (e.supported) out.emplace(e.name, r.get(e.name));
  return out;
}

// ---- writing ----

void save(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
          const std::map<std::string, std::string>& metadata) {
  std::vector<Declared> declared;
  std::vector<Tensor> contiguous;
  for (const auto& [name, t] : tensors) {
    DS_CHECK(t.defined(), "[safetensors] {}: tensor '{}' is undefined", path, name);
    declared.push_back({name, t.dtype(), t.shape()});
    contiguous.push_back(t.contiguous());
  }
  save_streamed(path, declared, metadata, [&](const WriteAt& write_at) {
    for (size_t i = 0; i < contiguous.size(); ++i)
      if (contiguous[i].nbytes() > 0)
        write_at(i, 0, contiguous[i].raw_data(), contiguous[i].nbytes());
  });
}

void save_streamed(const std::string& path, const std::vector<Declared>& tensors,
                   const std::map<std::string, std::string>& metadata,
                   const std::function<void(const WriteAt&)>& fill) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::vector<uint64_t> begins, sizes;
  for (const auto& t : tensors) {
    DS_CHECK(t.name != "__metadata__" && !header.contains(t.name),
             "[safetensors] {}: tensor name '{}' used twice (or reserved)", path, t.name);
    const uint64_t nbytes = static_cast<uint64_t>(shape_numel(t.shape)) * dtype_size(t.dtype);
    header[t.name] = {{"dtype", dtype_to_safetensors(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + nbytes}}};
    begins.push_back(offset);
    sizes.push_back(nbytes);
    offset += nbytes;
  }
  std::string json = header.dump();
  // Pad with spaces so the data region starts 8-byte aligned (what the reference writer does).
  json.append((8 - json.size() % 8) % 8, ' ');
  const uint64_t data_start = 8 + json.size();

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DS_CHECK(fd >= 0, "[safetensors] {}: cannot create {}: {}", path, tmp, errno_str());
  try {
    uint8_t len[8];
    uint64_t n = json.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
    write_all(fd, len, 8, path);
    write_all(fd, json.data(), json.size(), path);
    // Size the file first: tensors may be filled in any order.
    DS_CHECK(::ftruncate(fd, static_cast<off_t>(data_start + offset)) == 0,
             "[safetensors] {}: cannot size the file to {} bytes: {} (disk full?)", path,
             data_start + offset, errno_str());
    fill([&](size_t i, uint64_t at, const void* data, uint64_t bytes) {
      DS_CHECK(i < tensors.size() && at + bytes <= sizes[i],
               "[safetensors] {}: write of {} bytes at {} is outside tensor {}", path, bytes, at,
               i);
      const char* c = static_cast<const char*>(data);
      uint64_t pos = data_start + begins[i] + at;
      while (bytes > 0) {
        const ssize_t w = ::pwrite(fd, c, bytes, static_cast<off_t>(pos));
        if (w < 0 && errno == EINTR) continue;
        DS_CHECK(w > 0, "[safetensors] {}: write failed: {} (disk full?)", path, errno_str());
        c += w;
        pos += static_cast<uint64_t>(w);
        bytes -= static_cast<uint64_t>(w);
      }
    });
    DS_CHECK(::fsync(fd) == 0, "[safetensors] {}: fsync failed: {}", path, errno_str());
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  DS_CHECK(::close(fd) == 0, "[safetensors] {}: close failed: {}", path, errno_str());
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_str();
    ::unlink(tmp.c_str());
    DS_THROW("[safetensors] {}: cannot rename {} into place: {}", path, tmp, why);
  }
  // Make the rename itself durable.
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace ds::safetensors
