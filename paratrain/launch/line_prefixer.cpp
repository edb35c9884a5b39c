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
  if (terminal_) draw_status();
}

namespace {

constexpr std::string_view kClearLine = "\r\x1b[K";

// What a terminal would show of a line written with carriage returns: the
// text after the last '\r', without the clear-to-end-of-line code.
std::string_view visible_part(std::string_view line) {
  const size_t cr = line.rfind('\r');
  if (cr != std::string_view::npos) line.remove_prefix(cr + 1);
  if (line.substr(0, 3) == "\x1b[K") line.remove_prefix(3);
  return line;
}

}  // namespace

void LinePrefixer::draw_status() {
  const size_t cr = pending_.rfind('\r');
  if (cr == std::string::npos) return;
  // Older drafts of the status line are overwritten on screen anyway.
  pending_.erase(0, cr);
  const std::string_view text = visible_part(pending_);
  if (text.empty() || fd_ < 0) return;
  scratch_.assign(kClearLine);
  scratch_.append(prefix_);
  scratch_.append(text);
  if (!write_all(fd_, scratch_)) fd_ = -1;
}

void LinePrefixer::finish() {
  if (!pending_.empty()) emit(pending_);
  pending_.clear();
}

void LinePrefixer::emit(std::string_view line) {
  if (fd_ < 0) return;
  scratch_.clear();
  if (terminal_) {
    scratch_.assign(kClearLine);
    line = visible_part(line);
  }
  scratch_.append(prefix_);
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
