#pragma once
// Durable file writes shared by every layer that persists something (token shards, checkpoints,
// metrics, exports): a crash or a full disk never leaves a half-written file in place of a good
// one, and never leaves a temporary behind on a failure it sees.
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace ds {

// Writes bytes to path atomically: to "<path>.tmp-<pid>", fsync, rename over path, fsync of the
// folder. On any failure the temporary is removed and ds::Error names the file and the errno text
// ("[io] ..."). A process killed mid-write can still leave "<path>.tmp-<pid>"; callers that own a
// folder may delete such names at start-up.
void write_file_atomic(const std::filesystem::path& path, std::string_view bytes);

// The temporary name write_file_atomic uses for path in this process.
std::filesystem::path temporary_name(const std::filesystem::path& path);

// What a killed writer left in `dir` (not recursive): entries named "<name>.tmp-<pid>" (this
// file's writers), "<name>.tmp.<pid>" (safetensors) or "<name>.old-<pid>" whose process no longer
// runs on this machine, files or folders. With `name` given, only the leftovers of that output
// ("name.tmp-1", ".name.tmp-1", ".name.old-1", ...). A dead "<name>.old-<pid>" is the previous
// output set aside just before its replacement took the name: it is renamed back when `name`
// is missing (the replacement never landed) and deleted otherwise. Returns what it removed or
// restored; throws "[io] ..." when a removal fails.
std::vector<std::filesystem::path> remove_dead_temporaries(const std::filesystem::path& dir,
                                                           const std::string& name = "");

// fsync of a folder, making renames inside it durable. Filesystems that refuse fsync on folders
// are not an error.
void fsync_dir(const std::filesystem::path& dir);

// Writes len bytes to fd, retrying short writes and EINTR; ds::Error naming `path` otherwise.
void write_all(int fd, const void* data, size_t len, const std::filesystem::path& path);

// XXH64 (core/checksum.h) of a whole file, streamed, and its size in bytes.
uint64_t file_xxh64(const std::filesystem::path& path, uint64_t* size);

}  // namespace ds
