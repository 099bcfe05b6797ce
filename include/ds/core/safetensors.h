#pragma once
// The safetensors format (Hugging Face): the interchange format for weights and test fixtures.
//
//   [8 bytes]  N, the header length, unsigned little-endian
//   [N bytes]  JSON: {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
//                     ..., "__metadata__": {"key": "value", ...}}   (padded with spaces)
//   [rest]     raw little-endian tensor data; offsets are relative to the start of this region
//
// We read and write F32, BF16, F16, I32 and I64 (our dtypes). A file holding other dtypes (F64,
// U8, ...) still opens; only reading those tensors fails. Every error names the file.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ds/core/tensor.h"

namespace ds::safetensors {

struct Entry {
  std::string name;
  std::string dtype_name;  // as in the file ("F32", "BF16", ...)
  bool supported = false;  // dtype is one of ours (then `dtype` is meaningful)
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte range within the data region
};

// "F32" <-> DType::f32 etc.
const char* dtype_to_safetensors(DType t);

// A file opened for reading. The file is memory-mapped read-only for the reader's lifetime;
// tensors returned by get() are copies, so they outlive the reader.
class Reader {
 public:
  explicit Reader(const std::string& path);
  ~Reader();
  Reader(Reader&&) noexcept;
  Reader& operator=(Reader&&) noexcept;
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<Entry>& entries() const { return entries_; }  // in header order
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const;
  const Entry& entry(
      const std::string& name) const;  // throws "[safetensors] <path>: no tensor ..."
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // A metadata value, or throws naming the file and the key.
  const std::string& metadata(const std::string& key) const;

  Tensor get(const std::string& name) const;  // a contiguous copy in the file's dtype
  // Copies the tensor into dst (same shape; dtype converted, e.g. a BF16 file into fp32 weights).
  void read_into(const std::string& name, const Tensor& dst) const;

  // The entry's bytes inside the mapped file (valid while the Reader lives).
  const uint8_t* data_of(const Entry& e) const;

 private:
  void check_layout(const std::string& path, size_t data_size) const;
  std::string path_;
  std::shared_ptr<void> map_;  // the mapping; unmapped when the last owner goes
  size_t file_size_ = 0;
  size_t data_start_ = 0;  // 8 + header length
  std::vector<Entry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors (in the given order; any layout, written contiguous) and string metadata.
// Atomic: the data goes to "<path>.tmp.<pid>", is fsync'ed, then renamed over path, so a reader
// never sees a half-written file and a crash leaves the previous file intact.
void save(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
          const std::map<std::string, std::string>& metadata = {});

// The same file format and atomicity, for tensors too large to hold at once: `tensors` declares
// names, dtypes and shapes; `fill` then writes their bytes, in any order and pieces, through
// write_at(tensor index, byte offset within that tensor, data, bytes).
struct Declared {
  std::string name;
  DType dtype;
  Shape shape;
};
using WriteAt =
    std::function<void(size_t tensor, uint64_t byte_offset, const void* data, uint64_t bytes)>;
void save_streamed(const std::string& path, const std::vector<Declared>& tensors,
                   const std::map<std::string, std::string>& metadata,
                   const std::function<void(const WriteAt&)>& fill);

// Every supported tensor of a file, by name.
std::map<std::string, Tensor> load(const std::string& path);

}  // namespace ds::safetensors
