// Line splitting and prefixing of worker output (see line_prefixer.h).
#include "paratrain/launch/line_prefixer.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>

namespace paratrain::launch {

void LinePrefixer::feed(std::string_view bytes) {
  pending_.append(bytes);
  std::size_t start = 0;
  while (true) {
    const std::size_t nl = pending_.find('\n', start);
    if (nl == std::string::npos) break;
    emit(std::string_view(pending_).substr(start, nl - start));
    start = nl + 1;
  }
  while (pending_.size() - start >= kMaxLine) {
    emit(std::string_view(pending_).substr(start, kMaxLine));
    start += kMaxLine;
  }
  pending_.erase(0, start);
}

void LinePrefixer::finish() {
  if (!pending_.empty()) emit(pending_);
  pending_.clear();
}

void LinePrefixer::emit(std::string_view line) {
  if (fd_ < 0) return;
  scratch_.assign(prefix_);
  scratch_.append(line);
  scratch_.push_back('\n');
  // A sink that is gone stays gone: keep draining the worker, drop its text.
  if (!write_all(fd_, scratch_)) fd_ = -1;
}

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, 100);
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace paratrain::launch
