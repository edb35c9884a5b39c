// The /dev/shm mappings of the shm backend; see shm_map.h.
#include "paratrain/comm/shm/shm_map.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::comm::shm_detail {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

void* map_fd(int fd, const std::string& name, std::size_t bytes, int rank, bool unlink_on_failure) {
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (base != MAP_FAILED) return base;
  if (unlink_on_failure) shm_unlink(("/" + name).c_str());
  throw CommError(fmt::format("rank {}: cannot map /dev/shm/{} ({} bytes): {}", rank, name, bytes, errno_text(err)));
}

}  // namespace

void* create_mapping(const std::string& name, std::size_t bytes) {
  const int fd = shm_open(("/" + name).c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0)
    throw CommError(fmt::format("rank 0: cannot create the shared-memory segment /dev/shm/{}: {}. Is /dev/shm "
                                "mounted and writable?",
                                name, errno_text(errno)));
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    close(fd);
    shm_unlink(("/" + name).c_str());
    throw CommError(fmt::format("rank 0: cannot size the shared-memory segment /dev/shm/{} to {} bytes: {}. "
                                "/dev/shm may be too small (docker: --shm-size); lower the chunk size",
                                name, bytes, errno_text(err)));
  }
  return map_fd(fd, name, bytes, 0, true);
}

void* open_mapping(const std::string& name, std::size_t bytes, int rank) {
  const int fd = shm_open(("/" + name).c_str(), O_RDWR, 0600);
  if (fd < 0)
    throw CommError(fmt::format("rank {}: cannot open the shared-memory segment /dev/shm/{} created by rank 0: "
                                "{}. The shm backend needs every rank on rank 0's host (and /dev/shm shared "
                                "between them); use world.backend = \"gloo\" across hosts",
                                rank, name, errno_text(errno)));
  return map_fd(fd, name, bytes, rank, false);
}

void unlink_once_mapped(const std::string& name, const std::function<bool()>& all_mapped,
                        std::chrono::steady_clock::time_point deadline, const std::function<std::string()>& missing) {
  while (!all_mapped()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      shm_unlink(("/" + name).c_str());
      throw TimeoutError(missing());
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  shm_unlink(("/" + name).c_str());
}

}  // namespace paratrain::comm::shm_detail
