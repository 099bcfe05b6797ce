#include "ds/data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <utility>

#include "ds/core/error.h"
#include "ds/core/file_io.h"

namespace ds::data {

namespace fs = std::filesystem;

static_assert(std::endian::native == std::endian::little,
              "token shards are little-endian; add byte swaps for big-endian hosts");

namespace {

constexpr size_t kWriteBufferBytes = 1 << 20;

std::string errno_text() {
  return std::strerror(errno);
}

void finalize_header(ShardHeader& h) {
  h.header_checksum = xxh64(&h, offsetof(ShardHeader, header_checksum));
}

}  // namespace

// ---- writing ------------------------------------------------------------------------------------

ShardWriter::ShardWriter(fs::path path, uint32_t vocab_size)
    : ShardWriter(std::move(path), vocab_size, 0) {}

ShardWriter::ShardWriter(fs::path path, uint32_t vocab_size, uint32_t flags)
    : path_(std::move(path)),
      tmp_path_(temporary_name(path_)),
      vocab_size_(vocab_size),
      token_bytes_((flags & kShardFlagMask) ? 1 : token_bytes_for_vocab(vocab_size)),
      flags_(flags),
      buf_(kWriteBufferBytes) {
  DS_CHECK(vocab_size > 0, "[shard] vocab_size must be positive to write '{}'", path_.string());
  DS_CHECK((flags & ~kShardFlagMask) == 0, "[shard] unknown flags {:#x} for '{}'", flags,
           path_.string());
  DS_CHECK(!(flags & kShardFlagMask) || vocab_size == 2,
           "[shard] a mask shard holds 0/1 values: vocab_size must be 2, not {} ('{}')", vocab_size,
           path_.string());
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DS_CHECK(fd_ >= 0, "[shard] cannot create '{}': {}; check that the folder exists and is writable",
           tmp_path_.string(), errno_text());
  // Room for the header, which finish() fills in once the counts and checksum are known.
  const ShardHeader blank{};
  write_all(fd_, &blank, sizeof(blank), tmp_path_);
}

ShardWriter::~ShardWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

void ShardWriter::write(std::span<const int32_t> tokens) {
  DS_CHECK(fd_ >= 0, "[shard] write to '{}' after finish()", path_.string());
  for (int32_t t : tokens) {
    DS_CHECK(t >= 0 && static_cast<uint32_t>(t) < vocab_size_,
             "[shard] token {} is outside the vocabulary [0, {}) while writing '{}'", t,
             vocab_size_, path_.string());
    if (buf_used_ + token_bytes_ > buf_.size()) flush();
    if (token_bytes_ == 1) {
      buf_[buf_used_] = static_cast<unsigned char>(t);
    } else if (token_bytes_ == 2) {
      const auto v = static_cast<uint16_t>(t);
      std::memcpy(buf_.data() + buf_used_, &v, 2);
    } else {
      const auto v = static_cast<uint32_t>(t);
      std::memcpy(buf_.data() + buf_used_, &v, 4);
    }
    buf_used_ += token_bytes_;
  }
  num_tokens_ += tokens.size();
}

void ShardWriter::flush() {
  checksum_.update(buf_.data(), buf_used_);
  write_all(fd_, buf_.data(), buf_used_, tmp_path_);
  buf_used_ = 0;
}

ShardHeader ShardWriter::finish() {
  DS_CHECK(fd_ >= 0, "[shard] finish() called twice for '{}'", path_.string());
  flush();
  ShardHeader h{};
  std::memcpy(h.magic, kShardMagic, sizeof(h.magic));
  h.version = kShardVersion;
  h.token_bytes = token_bytes_;
  h.num_tokens = num_tokens_;
  h.vocab_size = vocab_size_;
  h.flags = flags_;
  h.payload_checksum = checksum_.digest();
  h.num_documents = num_documents_;
  finalize_header(h);
  DS_CHECK(::pwrite(fd_, &h, sizeof(h), 0) == static_cast<ssize_t>(sizeof(h)),
           "[shard] writing the header of '{}' failed: {}", tmp_path_.string(), errno_text());
  DS_CHECK(::fsync(fd_) == 0, "[shard] fsync of '{}' failed: {}", tmp_path_.string(), errno_text());
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp_path_.c_str());
    DS_THROW("[shard] cannot rename '{}' to '{}': {}", tmp_path_.string(), path_.string(), why);
  }
  fsync_dir(path_.parent_path());
  return h;
}

ShardHeader write_shard(const fs::path& path, std::span<const int32_t> tokens, uint32_t vocab_size,
                        uint64_t num_documents) {
  ShardWriter w(path, vocab_size);
  w.write(tokens);
  w.add_documents(num_documents);
  return w.finish();
}

// ---- reading ------------------------------------------------------------------------------------

Shard Shard::open(const fs::path& path, bool verify_checksum) {
  const std::string name = path.string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DS_CHECK(fd >= 0, "[shard] cannot open '{}': {}; create token shards with ds_prepare", name,
           errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    DS_THROW("[shard] cannot stat '{}': {}", name, why);
  }
  const auto file_size = static_cast<uint64_t>(st.st_size);

  Shard s;
  s.path_ = path;
  ShardHeader& h = s.header_;
  const bool got_header = file_size >= sizeof(h) && ::pread(fd, &h, sizeof(h), 0) == sizeof(h);
  auto fail = [&](std::string_view what) {
    ::close(fd);
    DS_THROW("[shard] '{}' is not a valid token shard: {}; re-create it with ds_prepare", name,
             what);
  };
  if (!got_header) fail(fmt::format("{} bytes is shorter than the 64-byte header", file_size));
  if (std::memcmp(h.magic, kShardMagic, sizeof(h.magic)) != 0)
    fail("bad magic (expected DSTOKENS)");
  if (h.version != kShardVersion)
    fail(fmt::format("format version {} is not supported (this build reads version {})", h.version,
                     kShardVersion));
  if (h.header_checksum != xxh64(&h, offsetof(ShardHeader, header_checksum)))
    fail("header checksum mismatch (the header is corrupt)");
  if ((h.flags & ~kShardFlagMask) != 0)
    fail(fmt::format("unknown flags {:#x} (this build knows {:#x})", h.flags, kShardFlagMask));
  if (h.flags & kShardFlagMask) {
    if (h.token_bytes != 1 || h.vocab_size != 2)
      fail(fmt::format("a mask shard needs token_bytes 1 and vocab_size 2, not {} and {}",
                       h.token_bytes, h.vocab_size));
  } else {
    if (h.token_bytes != 2 && h.token_bytes != 4)
      fail(fmt::format("token_bytes is {}, expected 2 or 4", h.token_bytes));
    if (h.vocab_size == 0 || h.token_bytes != token_bytes_for_vocab(h.vocab_size))
      fail(fmt::format("token_bytes {} does not match vocab_size {}", h.token_bytes, h.vocab_size));
  }
  const uint64_t expected = kShardHeaderBytes + h.num_tokens * h.token_bytes;
  if (h.num_tokens > (UINT64_MAX - kShardHeaderBytes) / 4 || file_size != expected)
    fail(
        fmt::format("file size is {} bytes but the header promises {} ({} tokens); the file is "
                    "truncated or was not finished",
                    file_size, expected, h.num_tokens));

  // Map everything, header included, so the payload offset needs no page alignment.
  s.map_len_ = static_cast<size_t>(file_size);
  void* map = ::mmap(nullptr, s.map_len_, PROT_READ, MAP_SHARED, fd, 0);
  const std::string why = errno_text();
  ::close(fd);  // the mapping keeps the file alive
  DS_CHECK(map != MAP_FAILED, "[shard] mmap of '{}' ({} bytes) failed: {}", name, file_size, why);
  s.map_ = map;
  if (verify_checksum) s.verify();
  return s;
}

Shard::Shard(Shard&& o) noexcept
    : path_(std::move(o.path_)),
      header_(o.header_),
      map_(std::exchange(o.map_, nullptr)),
      map_len_(std::exchange(o.map_len_, 0)) {}

Shard& Shard::operator=(Shard&& o) noexcept {
  if (this != &o) {
    if (map_) ::munmap(map_, map_len_);
    path_ = std::move(o.path_);
    header_ = o.header_;
    map_ = std::exchange(o.map_, nullptr);
    map_len_ = std::exchange(o.map_len_, 0);
  }
  return *this;
}

Shard::~Shard() {
  if (map_) ::munmap(map_, map_len_);
}

void Shard::verify() const {
  const uint64_t got = xxh64(payload(), header_.num_tokens * header_.token_bytes);
  DS_CHECK(
      got == header_.payload_checksum,
      "[shard] '{}': payload checksum mismatch (stored {:016x}, computed {:016x}); the file is "
      "corrupt, re-create it with ds_prepare",
      path_.string(), header_.payload_checksum, got);
}

void Shard::read(uint64_t start, std::span<int32_t> out) const {
  DS_CHECK(start <= header_.num_tokens && out.size() <= header_.num_tokens - start,
           "[shard] '{}': read of tokens [{}, {}) is past its end ({} tokens)", path_.string(),
           start, start + out.size(), header_.num_tokens);
  const auto* base = static_cast<const unsigned char*>(payload());
  // Every id is checked against the header's vocab_size as it is copied (a max folded into the copy
  // loop, which the compiler vectorises): one flipped bit in a shard must not become an
  // out-of-bounds embedding row or histogram bin further up.
  uint32_t largest = 0;
  if (header_.token_bytes == 1) {
    const auto* src = base + start;
    for (size_t i = 0; i < out.size(); ++i) {
      out[i] = src[i];
      largest = std::max<uint32_t>(largest, src[i]);
    }
  } else if (header_.token_bytes == 2) {
    const auto* src = reinterpret_cast<const uint16_t*>(base) + start;
    for (size_t i = 0; i < out.size(); ++i) {
      out[i] = src[i];
      largest = std::max<uint32_t>(largest, src[i]);
    }
  } else {
    const auto* src = reinterpret_cast<const uint32_t*>(base) + start;
    for (size_t i = 0; i < out.size(); ++i) {
      out[i] = static_cast<int32_t>(src[i]);
      largest = std::max(largest, src[i]);
    }
  }
  if (!out.empty() && largest >= header_.vocab_size) {
    for (size_t i = 0; i < out.size(); ++i) {
      const uint32_t id = static_cast<uint32_t>(out[i]);
      if (id < header_.vocab_size) continue;
      const uint64_t token = start + i;
      DS_THROW(
          "[shard] '{}': token {} (byte offset {}) is id {}, outside the vocabulary of {} ids: the "
          "shard is corrupted; recreate it with ds_prepare",
          path_.string(), token, sizeof(ShardHeader) + token * header_.token_bytes, id,
          header_.vocab_size);
    }
  }
}

int32_t Shard::at(uint64_t i) const {
  int32_t v;
  read(i, std::span<int32_t>(&v, 1));
  return v;
}

}  // namespace ds::data
