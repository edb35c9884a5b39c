// Permission problems with checkpoints, told apart from damage. A damaged
// checkpoint may be skipped and moved aside; one this process may not read
// may be perfectly good, so nothing may happen to it. See Note [Unreadable
// is not damaged] in the .cpp. Not the reading itself (checkpoint_index.h,
// safetensors.h).
#pragma once

#include <filesystem>
#include <system_error>

#include "paratrain/core/error.h"

namespace paratrain::checkpoint {

// A checkpoint, or a file of one, exists but this process is not allowed to
// read it (EACCES or EPERM). Nothing is known about its contents.
class CheckpointAccessError : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

// True for the errors that mean "not allowed" rather than "not there" or
// "damaged".
bool is_permission_error(const std::error_code& ec);

// The error for `path`, which could not be opened or looked into because of
// `ec`: the path, the owner and mode, this process's user, and what to do.
CheckpointAccessError checkpoint_access_error(const std::filesystem::path& path, const std::error_code& ec);

// Throws checkpoint_access_error when `path` (a file, or a directory: it
// must be listable) cannot be opened for reading for lack of permission.
// Any other failure (no such file, ...) is left to the caller's own read.
void check_checkpoint_readable(const std::filesystem::path& path);

}  // namespace paratrain::checkpoint
