#pragma once
// Housekeeping of a checkpoint folder (the layout is in checkpoint.cpp and docs/checkpoints.md).
//
// Engine::save_checkpoint writes a tag into the hidden folder ".<tag>.tmp", swaps an older folder
// of the same tag out as ".<tag>.old", and replaces `latest` through "latest.tmp-<pid>". A crash
// (kill, power loss, full disk) can leave any of these behind, and they can be as large as a whole
// checkpoint. None of them is ever read back: a complete checkpoint is only ever a plain tag folder
// named in `latest`.
//
// Not thread-safe with respect to a concurrent save into the same folder: call these from the one
// process (rank 0) that owns the folder, before training starts or after a save has returned.
#include <filesystem>
#include <string>
#include <vector>

namespace ds::runtime {

// Deletes the temporaries a crashed save left in `dir` (".<tag>.tmp", ".<tag>.old",
// ".<tag>.deleting" folders and "latest.tmp-<pid>" files); returns what it deleted, for a message.
// A missing `dir` is not an error (nothing to clean).
std::vector<std::filesystem::path> remove_stale_checkpoint_temporaries(
    const std::filesystem::path& dir);

// Deletes the checkpoint folder `dir/tag` so that a crash part-way never leaves a half-deleted tag
// folder that looks like a checkpoint: the folder is first renamed to the hidden ".<tag>.deleting"
// (atomic), then removed. Throws ds::Error naming the folder when it cannot be renamed or removed.
void delete_checkpoint(const std::filesystem::path& dir, const std::string& tag);

// The tag named by `dir/latest` (its first line, trimmed). Errors (a [tag] prefix from `who`, e.g.
// "[checkpoint]") name the file when it is missing, a folder, empty, over 4 KiB (a tag is one short
// name) or not a plain folder name; its contents are quoted escaped and cut (ds::quoted_excerpt),
// never raw: a damaged `latest` may be binary or huge.
std::string read_latest_tag(const std::filesystem::path& dir, const std::string& who);

}  // namespace ds::runtime
