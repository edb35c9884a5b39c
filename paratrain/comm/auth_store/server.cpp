// The authenticated store's server loop: see server.h.
#include "paratrain/comm/auth_store/server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <list>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "paratrain/comm/auth_store/handshake.h"
#include "paratrain/comm/auth_store/table.h"
#include "paratrain/core/error.h"

namespace paratrain::comm::auth {
namespace {

using Clock = std::chrono::steady_clock;

// The largest hello a client may send: magic, u16 length, job id, nonce, MAC.
constexpr std::size_t kHelloFixed = kMagic.size() + 2 + kNonceBytes + kMacBytes;
constexpr std::size_t kReadChunk = 64 * 1024;

struct Conn {
  int fd = -1;
  std::string peer;
  bool admitted = false;
  Nonce nonce{};
  Clock::time_point handshake_deadline;
  std::vector<std::uint8_t> in;
  std::vector<std::uint8_t> out;
  std::optional<PendingWait> waiting;
  bool dead = false;
};

std::string peer_of(const sockaddr_storage& sa) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (sa.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&sa);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
  } else if (sa.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    port = ntohs(in6->sin6_port);
    return fmt::format("[{}]:{}", host, port);
  }
  return fmt::format("{}:{}", host, port);
}

// A job id as it may be logged: a hostile peer chooses these bytes.
std::string printable(const std::string& s) {
  std::string out;
  for (char c : s) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return out;
}

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

}  // namespace

struct StoreServer::Impl {
  StoreServerOptions opts;
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  int port = 0;
  std::string where;
  std::atomic<bool> stopping{false};
  std::list<Conn> conns;
  KeyTable table;
  bool changed = false;
  std::size_t dropped_for_cap = 0;  // Note [Pending handshakes]
  std::thread thread;

  void listen_on() {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* found = nullptr;
    const std::string service = std::to_string(opts.port);
    const int rc = getaddrinfo(opts.bind_address.c_str(), service.c_str(), &hints, &found);
    if (rc != 0) {
      throw CommError(fmt::format("the authenticated store cannot listen on '{}': {}; set PARATRAIN_STORE_BIND "
                                  "to an address of this host", opts.bind_address, gai_strerror(rc)));
    }
    std::string last_error = "no address";
    for (auto* a = found; a != nullptr && listen_fd < 0; a = a->ai_next) {
      const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      const int one = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 1024) == 0) {
        listen_fd = fd;
      } else {
        last_error = std::strerror(errno);
        close(fd);
      }
    }
    freeaddrinfo(found);
    if (listen_fd < 0) {
      throw CommError(fmt::format("could not serve the authenticated store on {}:{}: {}. Is the port already "
                                  "in use? Pick another MASTER_PORT", opts.bind_address, opts.port, last_error));
    }
    sockaddr_storage sa{};
    socklen_t len = sizeof sa;
    getsockname(listen_fd, reinterpret_cast<sockaddr*>(&sa), &len);
    port = sa.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&sa)->sin6_port)
                                    : ntohs(reinterpret_cast<sockaddr_in*>(&sa)->sin_port);
    where = fmt::format("{}:{}", opts.bind_address, port);
    set_nonblocking(listen_fd);
  }

  // Logs why, tells a client that spoke our protocol the verdict (one
  // best-effort non-blocking byte: never waits on a hostile peer), closes.
  void refuse(Conn& c, Verdict verdict, const std::string& reason, bool log = true) {
    if (log) spdlog::warn("paratrain store on {}: refused {}: {}", where, c.peer, reason);
    const auto byte = static_cast<std::uint8_t>(verdict);
    (void)!send(c.fd, &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    drop(c);
    if (opts.on_refused) opts.on_refused(c.peer, reason);
  }

  void drop(Conn& c) {
    if (c.fd >= 0) close(c.fd);
    c.fd = -1;
    c.dead = true;
  }

  void accept_all() {
    while (true) {
      sockaddr_storage sa{};
      socklen_t len = sizeof sa;
      const int fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&sa), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN, or a connection that went away: nothing to do
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      Conn& c = conns.emplace_back();
      c.fd = fd;
      c.peer = peer_of(sa);
      c.handshake_deadline = Clock::now() + opts.handshake_timeout;
      c.nonce = random_nonce();
      c.out.insert(c.out.end(), kMagic.begin(), kMagic.end());
      c.out.insert(c.out.end(), c.nonce.begin(), c.nonce.end());
      cap_pending();
    }
  }

  // Note [Pending handshakes]
  // Every accepted connection costs a file descriptor and a slot until it
  // is admitted, refused, or its handshake_timeout passes (30 s). Clients
  // that connect and never finish (a flood, a port scanner, a peer stuck
  // half-open) could otherwise take every descriptor of the rank or agent
  // serving the store within that window, and the job's own ranks could
  // not connect any more. So at most max_pending_handshakes wait at once,
  // and one more drops the *oldest* of them: a real client answers the
  // challenge within one round trip, so it is almost never the oldest, while
  // refusing the newest would refuse exactly the ranks that arrive during a
  // flood. Logged the first time and at every power of ten, not per drop:
  // a flood must not fill the log either.
  void cap_pending() {
    std::size_t pending = 0;
    Conn* oldest = nullptr;  // conns is in accept order
    for (auto& c : conns) {
      if (c.dead || c.admitted) continue;
      if (oldest == nullptr) oldest = &c;
      ++pending;
    }
    if (pending <= opts.max_pending_handshakes || oldest == nullptr) return;
    ++dropped_for_cap;
    const std::string reason = fmt::format(
        "{} connections were in their handshake, more than the cap of {} (max_pending_handshakes): the oldest is "
        "dropped, so that clients that never finish cannot exhaust the store ({} dropped so far)",
        pending, opts.max_pending_handshakes, dropped_for_cap);
    bool power_of_ten = true;
    for (auto n = dropped_for_cap; n > 1; n /= 10) power_of_ten = power_of_ten && n % 10 == 0;
    refuse(*oldest, Verdict::malformed, reason, power_of_ten);
  }

  // The client's hello, once enough bytes arrived: see Note [Store handshake].
  void handshake(Conn& c) {
    const std::size_t n = std::min(c.in.size(), kMagic.size());
    if (std::memcmp(c.in.data(), kMagic.data(), n) != 0) {
      return refuse(c, Verdict::malformed,
                    "not a paratrain store client: its first bytes are not the handshake (a plain TCPStore "
                    "client, another program, or garbage; a PyTorch program under `paratrain launch` needs "
                    "`--plain-store`)");
    }
    if (c.in.size() < kMagic.size() + 2) return;
    const std::size_t job_len = c.in[8] | static_cast<std::size_t>(c.in[9]) << 8;
    if (job_len > kMaxJobIdBytes) {
      return refuse(c, Verdict::malformed,
                    fmt::format("its hello claims a job id of {} bytes (the limit is {})", job_len, kMaxJobIdBytes));
    }
    const std::size_t need = kHelloFixed + job_len;
    if (c.in.size() < need) return;
    if (c.in.size() > need) return refuse(c, Verdict::malformed, "it sent bytes after its hello, before being admitted");
    const std::string job(c.in.begin() + 10, c.in.begin() + 10 + static_cast<std::ptrdiff_t>(job_len));
    Nonce client_nonce{};
    Mac mac{};
    std::copy_n(c.in.begin() + 10 + static_cast<std::ptrdiff_t>(job_len), kNonceBytes, client_nonce.begin());
    std::copy_n(c.in.begin() + 10 + static_cast<std::ptrdiff_t>(job_len + kNonceBytes), kMacBytes, mac.begin());
    c.in.clear();
    if (job != opts.job_id) {
      return refuse(c, Verdict::wrong_job,
                    fmt::format("another job id '{}' (this store serves job '{}')", printable(job), opts.job_id));
    }
    if (!equal(mac, client_mac(opts.token, c.nonce, client_nonce, job))) {
      return refuse(c, Verdict::wrong_token, "wrong job token (its answer to the challenge does not verify)");
    }
    c.admitted = true;
    c.out.push_back(static_cast<std::uint8_t>(Verdict::admitted));
    const Mac proof = server_mac(opts.token, c.nonce, client_nonce, job);
    c.out.insert(c.out.end(), proof.begin(), proof.end());
  }

  // Serves the complete frames an admitted client sent, in order; stops at a
  // wait that must be parked (clients are synchronous: nothing follows it).
  void serve_frames(Conn& c) {
    std::size_t used = 0;
    while (!c.dead && !c.waiting && c.in.size() - used >= 4) {
      const std::uint32_t len = load_u32(c.in.data() + used);
      if (len > kMaxFrameBytes) {
        spdlog::warn("paratrain store on {}: dropped {}: a request of {} bytes (the limit is {})", where, c.peer, len,
                     kMaxFrameBytes);
        return drop(c);
      }
      if (c.in.size() - used - 4 < len) break;
      Reader r(c.in.data() + used + 4, len);
      used += 4 + len;
      Outcome o = table.apply(r, Clock::now());
      if (o.malformed) {
        spdlog::warn("paratrain store on {}: dropped {}: a malformed request", where, c.peer);
        return drop(c);
      }
      changed = changed || o.changed;
      if (o.park) {
        c.waiting = std::move(o.park);
      } else {
        c.out.insert(c.out.end(), o.reply.begin(), o.reply.end());
      }
    }
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(used));
  }

  // Answers parked waits that are ready or expired, and serves what their
  // clients sent since, until no write wakes another wait.
  void pump() {
    do {
      changed = false;
      const auto now = Clock::now();
      for (auto& c : conns) {
        if (c.dead || !c.admitted) continue;
        if (c.waiting) {
          if (table.has_all(c.waiting->keys)) {
            c.waiting.reset();
            auto r = reply_status(Status::ok);
            c.out.insert(c.out.end(), r.begin(), r.end());
          } else if (c.waiting->deadline && now >= *c.waiting->deadline) {
            c.waiting.reset();
            auto r = reply_status(Status::timeout);
            c.out.insert(c.out.end(), r.begin(), r.end());
          }
        }
        serve_frames(c);
      }
    } while (changed);
  }

  void read_from(Conn& c) {
    // Before admission nobody gets to make us buffer more than a hello.
    const std::size_t cap = c.admitted ? kReadChunk : kHelloFixed + kMaxJobIdBytes + 1 - c.in.size();
    const std::size_t old = c.in.size();
    c.in.resize(old + cap);
    const ssize_t got = recv(c.fd, c.in.data() + old, cap, 0);
    c.in.resize(old + static_cast<std::size_t>(std::max<ssize_t>(got, 0)));
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
      if (!c.admitted) {
        return refuse(c, Verdict::malformed, "it closed the connection before completing the handshake");
      }
      return drop(c);  // a client that is done
    }
    if (!c.admitted) return handshake(c);
    if (c.waiting && c.in.size() > kMaxFrameBytes) {
      spdlog::warn("paratrain store on {}: dropped {}: it sent {} bytes while waiting", where, c.peer, c.in.size());
      drop(c);
    }
  }

  void write_to(Conn& c) {
    while (!c.out.empty()) {
      const ssize_t put = send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (put < 0) {
        if (errno != EAGAIN && errno != EINTR) drop(c);
        return;
      }
      c.out.erase(c.out.begin(), c.out.begin() + put);
    }
  }

  int poll_timeout_ms() const {
    std::optional<Clock::time_point> next;
    for (const auto& c : conns) {
      if (!c.admitted && (!next || c.handshake_deadline < *next)) next = c.handshake_deadline;
      if (c.waiting && c.waiting->deadline && (!next || *c.waiting->deadline < *next)) next = c.waiting->deadline;
    }
    if (!next) return -1;
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(*next - Clock::now()).count();
    return static_cast<int>(std::clamp<long long>(ms, 0, 60000));
  }

  void run() {
    std::vector<pollfd> fds;
    while (!stopping.load()) {
      fds.clear();
      fds.push_back({wake[0], POLLIN, 0});
      fds.push_back({listen_fd, POLLIN, 0});
      for (const auto& c : conns) {
        fds.push_back({c.fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      }
      if (poll(fds.data(), fds.size(), poll_timeout_ms()) < 0 && errno != EINTR) {
        spdlog::error("paratrain store on {}: poll failed: {}", where, std::strerror(errno));
        return;
      }
      if (fds[0].revents != 0) return;
      if (fds[1].revents & POLLIN) accept_all();
      std::size_t i = 2;
      for (auto& c : conns) {
        if (i >= fds.size()) break;  // accepted in this round: polled next round
        const short ev = fds[i++].revents;
        if (!c.dead && (ev & (POLLIN | POLLHUP | POLLERR))) read_from(c);
      }
      const auto now = Clock::now();
      for (auto& c : conns) {
        if (!c.dead && !c.admitted && now >= c.handshake_deadline) {
          refuse(c, Verdict::malformed,
                 fmt::format("no complete handshake within {} ms (a half-open or silent connection)",
                             opts.handshake_timeout.count()));
        }
      }
      pump();
      for (auto& c : conns) {
        if (!c.dead) write_to(c);
      }
      conns.remove_if([](const Conn& c) { return c.dead; });
    }
  }
};

StoreServer::StoreServer(StoreServerOptions options) : impl_(std::make_unique<Impl>()) {
  if (!available()) {
    throw CommError("this paratrain was built without libsodium: no authenticated store; install libsodium-dev "
                    "and rebuild, or unset PARATRAIN_JOB_TOKEN");
  }
  if (options.token.empty()) throw ConfigError("the authenticated store needs a non-empty job token");
  impl_->opts = std::move(options);
  impl_->listen_on();
  if (pipe2(impl_->wake, O_CLOEXEC) != 0) {
    close(impl_->listen_fd);
    throw CommError(fmt::format("the authenticated store could not create its wake-up pipe: {}", std::strerror(errno)));
  }
  impl_->thread = std::thread([impl = impl_.get()] {
    try {
      impl->run();
    } catch (const std::exception& e) {
      // A store that stops serving makes every rank time out naming it;
      // terminating rank 0's process from a helper thread would be worse.
      spdlog::error("paratrain store on {}: stopped serving: {}", impl->where, e.what());
    }
  });
}

StoreServer::~StoreServer() {
  impl_->stopping = true;
  const char byte = 1;
  (void)!write(impl_->wake[1], &byte, 1);
  impl_->thread.join();
  for (auto& c : impl_->conns) impl_->drop(c);
  close(impl_->listen_fd);
  close(impl_->wake[0]);
  close(impl_->wake[1]);
}

int StoreServer::port() const { return impl_->port; }

std::string StoreServer::where() const { return impl_->where; }

}  // namespace paratrain::comm::auth
