// Self-pipe signal capture for the launcher (see signal_capture.h).
#include "paratrain/launch/signal_capture.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::launch {
namespace {

std::atomic<int> g_write_fd{-1};
static_assert(std::atomic<int>::is_always_lock_free, "the handler reads it");

extern "C" void on_signal(int sig) {
  const int saved = errno;
  const int fd = g_write_fd.load();
  if (fd >= 0) {
    const unsigned char byte = static_cast<unsigned char>(sig);
    // Non-blocking: a full pipe means plenty of signals are already queued.
    [[maybe_unused]] ssize_t n = write(fd, &byte, 1);
  }
  errno = saved;
}

}  // namespace

SignalCapture::SignalCapture() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw Error(fmt::format("launcher: cannot create its signal pipe: {}", std::strerror(errno)));
  }
  int expected = -1;
  if (!g_write_fd.compare_exchange_strong(expected, fds[1])) {
    close(fds[0]);
    close(fds[1]);
    throw Error("launcher: another launch is already running in this process; run one at a time");
  }
  read_fd_ = fds[0];
  write_fd_ = fds[1];

  for (std::size_t i = 0; i < std::size(kChanged); ++i) {
    const int sig = kChanged[i];
    sigaction(sig, nullptr, &old_[i]);
    struct sigaction sa {};
    sigemptyset(&sa.sa_mask);
    if (sig == SIGPIPE) {
      sa.sa_handler = SIG_IGN;  // a failed write then returns EPIPE instead
    } else if (sig == SIGCHLD) {
      // SIG_IGN here would make the kernel reap workers before waitpid sees them.
      sa.sa_handler = SIG_DFL;
    } else {
      if (old_[i].sa_handler == SIG_IGN) continue;
      sa.sa_handler = on_signal;
      sa.sa_flags = SA_RESTART;
    }
    sigaction(sig, &sa, nullptr);
    changed_[i] = true;
  }
  // Signals blocked in this thread would be held until the launch ends.
  sigset_t forwarded;
  sigemptyset(&forwarded);
  for (int sig : kForwarded) sigaddset(&forwarded, sig);  // ignored ones stay ignored anyway
  sigaddset(&forwarded, SIGUSR1);
  sigaddset(&forwarded, SIGUSR2);
  pthread_sigmask(SIG_UNBLOCK, &forwarded, &old_mask_);
}

SignalCapture::~SignalCapture() {
  for (std::size_t i = 0; i < std::size(kChanged); ++i) {
    if (changed_[i]) sigaction(kChanged[i], &old_[i], nullptr);
  }
  pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  g_write_fd.store(-1);
  close(read_fd_);
  close(write_fd_);
}

int SignalCapture::take() {
  unsigned char byte = 0;
  while (true) {
    const ssize_t n = read(read_fd_, &byte, 1);
    if (n == 1) return byte;
    if (n < 0 && errno == EINTR) continue;
    return 0;
  }
}

bool SignalCapture::was_ignored(int sig) const {
  for (std::size_t i = 0; i < std::size(kChanged); ++i) {
    if (kChanged[i] == sig) return old_[i].sa_handler == SIG_IGN;
  }
  struct sigaction now {};
  sigaction(sig, nullptr, &now);
  return now.sa_handler == SIG_IGN;
}

}  // namespace paratrain::launch

