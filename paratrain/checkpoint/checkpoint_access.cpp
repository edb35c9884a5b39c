// Telling "may not read" apart from "damaged" (checkpoint_access.h).
//
// Note [Unreadable is not damaged]
// A checkpoint directory of mode 000, or one written by another user, looks
// from here exactly like an interrupted save (no index.json can be seen) or a
// damaged checkpoint (its shard cannot be read whole). Treating it as either
// loses work: an interrupted save is deleted, a damaged checkpoint is skipped
// (train.resume = auto retrains from an older one and later fails when it
// saves over it). So every read of a checkpoint checks permissions first and
// throws CheckpointAccessError, which no caller deletes, moves aside or
// skips: the run stops, naming the file and the fix (chmod/chown, or run as
// the checkpoint's owner).
#include "paratrain/checkpoint/checkpoint_access.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

namespace paratrain::checkpoint {

bool is_permission_error(const std::error_code& ec) {
  return ec == std::errc::permission_denied || ec == std::errc::operation_not_permitted;
}

CheckpointAccessError checkpoint_access_error(const std::filesystem::path& path, const std::error_code& ec) {
  struct stat st {};
  std::string owner;
  if (::stat(path.c_str(), &st) == 0) {
    owner = fmt::format(" (owner uid {}, mode {:04o}; this process runs as uid {})", st.st_uid, st.st_mode & 07777,
                        ::geteuid());
  } else {
    owner = fmt::format(" (this process runs as uid {})", ::geteuid());
  }
  return CheckpointAccessError(fmt::format(
      "cannot read checkpoint '{}': {}{}. It is left as it is (nothing unread is deleted or moved aside): give "
      "this user read access (chmod -R u+rX or chown) or run as the user that wrote it, then resume again",
      path.string(), ec.message(), owner));
}

void check_checkpoint_readable(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::close(fd);
    return;
  }
  const std::error_code ec(errno, std::generic_category());
  if (is_permission_error(ec)) throw checkpoint_access_error(path, ec);
}

}  // namespace paratrain::checkpoint
