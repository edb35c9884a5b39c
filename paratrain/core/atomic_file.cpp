#include "paratrain/core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain {
namespace {

void fsync_path(const std::filesystem::path& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) throw Error(fmt::format("cannot open {} to sync it: {}", path.string(), std::strerror(errno)));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw Error(fmt::format("fsync({}) failed: {}; check the disk", path.string(), std::strerror(err)));
}

}  // namespace

void write_file_atomically(const std::filesystem::path& path, std::string_view bytes, AtomicWriteOptions options) {
  const auto folder = path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) throw Error(fmt::format("cannot create the folder {}: {}", folder.string(), ec.message()));
  auto tmp = path;
  tmp += fmt::format(".tmp.{}", getpid());
  try {
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw Error(fmt::format("cannot create {}: {}", tmp.string(), std::strerror(errno)));
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = errno;
        ::close(fd);
        throw Error(fmt::format("cannot write {}: {}; check free space", tmp.string(), std::strerror(err)));
      }
      done += static_cast<size_t>(n);
    }
    const int rc = options.sync ? ::fsync(fd) : 0;
    const int err = errno;
    ::close(fd);
    if (rc != 0) throw Error(fmt::format("fsync({}) failed: {}", tmp.string(), std::strerror(err)));
    std::filesystem::rename(tmp, path, ec);
    if (ec) throw Error(fmt::format("cannot replace {}: {}", path.string(), ec.message()));
    if (options.sync) fsync_path(folder, O_RDONLY | O_DIRECTORY);
  } catch (...) {
    std::filesystem::remove(tmp, ec);
    throw;
  }
}

}  // namespace paratrain
