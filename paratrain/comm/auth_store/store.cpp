// The authenticated store's client: see store.h.
#include "paratrain/comm/auth_store/store.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "paratrain/comm/auth_store/handshake.h"
#include "paratrain/comm/auth_store/wire.h"
#include "paratrain/core/error.h"

namespace paratrain::comm::auth {
namespace {

using Clock = std::chrono::steady_clock;
using Deadline = std::optional<Clock::time_point>;

// Replies to requests the server answers at once still get this long: a
// stopped or wedged server becomes an error instead of a hang.
constexpr auto kReplyGrace = std::chrono::seconds(30);

Deadline deadline_after(std::chrono::milliseconds d) {
  if (d <= std::chrono::milliseconds::zero()) return std::nullopt;  // c10d's kNoTimeout
  return Clock::now() + d;
}

double seconds(std::chrono::milliseconds d) { return std::chrono::duration<double>(d).count(); }

// Waits until fd is ready for `events`; false at the deadline.
bool ready(int fd, short events, Deadline deadline) {
  while (true) {
    int ms = -1;
    if (deadline) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now()).count();
      if (left <= 0) return false;
      ms = static_cast<int>(std::min<long long>(left, 60000));
    }
    pollfd p{fd, events, 0};
    const int rc = poll(&p, 1, ms);
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return true;  // let the read/write report the error
  }
}

enum class Io { done, closed, timeout };

Io read_exact(int fd, void* buf, std::size_t n, Deadline deadline, std::string& error) {
  auto* p = static_cast<std::uint8_t*>(buf);
  while (n > 0) {
    if (!ready(fd, POLLIN, deadline)) return Io::timeout;
    const ssize_t got = recv(fd, p, n, MSG_DONTWAIT);
    if (got == 0) return Io::closed;
    if (got < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      error = std::strerror(errno);
      return Io::closed;
    }
    p += got;
    n -= static_cast<std::size_t>(got);
  }
  return Io::done;
}

Io write_all(int fd, const void* buf, std::size_t n, Deadline deadline, std::string& error) {
  const auto* p = static_cast<const std::uint8_t*>(buf);
  while (n > 0) {
    if (!ready(fd, POLLOUT, deadline)) return Io::timeout;
    const ssize_t put = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (put < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      error = std::strerror(errno);
      return Io::closed;
    }
    p += put;
    n -= static_cast<std::size_t>(put);
  }
  return Io::done;
}

// One connection attempt per address of host; -1 (and why) when none took.
int try_connect(const std::string& host, int port, Deadline deadline, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) {
    why = gai_strerror(rc);
    return -1;
  }
  int result = -1;
  for (auto* a = found; a != nullptr && result < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    // connect() can fail at once, not with EINPROGRESS,
    // when there is no route (ENETUNREACH while a link is down) or the port
    // is closed (ECONNREFUSED). That is a failed attempt the caller retries,
    // never a connection: taking it for one read the greeting from an
    // unconnected socket (ENOTCONN) and ended a rank that started while its
    // network was down, instead of waiting for the link until the timeout.
    int err = 0;
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        err = ETIMEDOUT;
        socklen_t len = sizeof err;
        if (ready(fd, POLLOUT, deadline)) getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      }
    }
    if (err == 0) {
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      result = fd;
    } else {
      why = std::strerror(err);
      close(fd);
    }
  }
  freeaddrinfo(found);
  return result;
}

// The handshake failed: the connection is of no further use.
template <typename E>
[[noreturn]] void fail_closing(int& fd, E error) {
  close(fd);
  fd = -1;
  throw error;
}

}  // namespace

// Note [Probing for the greeting]
// A process without PARATRAIN_JOB_TOKEN connects c10d's TCPStore client. If
// the port is served by this store instead (a hand-started rank meeting a
// `paratrain launch` job), that client's background thread reads our
// greeting as a reply, takes 8 of its bytes for a length of ~5.7e18 and
// dies in std::bad_alloc or std::length_error (std::terminate: exit 134, no
// message). The length is c10d's to bound, not ours, so the rendezvous asks
// first: our server speaks as soon as it accepts, c10d's never speaks first.
// Nothing is sent, so a TCPStore server only sees a connection open and
// close. A greeting slower than greet_within (a server thread starved for
// that long) reads as silent and leaves the old failure; that is the cost
// of not writing c10d's private wire format here.
Greeting probe_greeting(const std::string& host, int port, std::chrono::milliseconds connect_within,
                        std::chrono::milliseconds greet_within, std::string& why) {
  const Deadline connect_by = deadline_after(connect_within);
  int fd = -1;
  while ((fd = try_connect(host, port, connect_by, why)) < 0) {
    if (connect_by && Clock::now() >= *connect_by) return Greeting::unreachable;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::uint8_t magic[kMagic.size()];
  const Io io = read_exact(fd, magic, sizeof magic, deadline_after(greet_within), why);
  close(fd);
  const bool ours = io == Io::done && std::memcmp(magic, kMagic.data(), kMagic.size()) == 0;
  return ours ? Greeting::authenticated : Greeting::silent;
}

AuthStore::AuthStore(AuthStoreOptions o) : c10d::Store(o.timeout), options_(o) {
  where_ = fmt::format("{}:{}", o.host, o.port);
  if (o.token.empty()) throw ConfigError("the authenticated store needs a non-empty job token (PARATRAIN_JOB_TOKEN)");
  const Deadline deadline = deadline_after(o.timeout);
  std::string why;
  // Rank 0 may not be listening yet: retry refused connections until the timeout.
  while ((fd_ = try_connect(o.host, o.port, deadline, why)) < 0) {
    if (deadline && Clock::now() >= *deadline) {
      throw TimeoutError(fmt::format("could not reach the authenticated store at {} within {} s: {}. Rank 0 "
                                     "(which serves the store) never arrived or the address is wrong",
                                     where_, seconds(o.timeout), why));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::uint8_t greeting[kMagic.size() + kNonceBytes];
  switch (read_exact(fd_, greeting, sizeof greeting, deadline, why)) {
    case Io::timeout:
      fail_closing(fd_, TimeoutError(fmt::format("the store at {} sent no greeting within {} s: it is not an authenticated "
                                    "paratrain store (a plain TCPStore?). Set the same PARATRAIN_JOB_TOKEN for "
                                    "every rank, rank 0 included",
                                    where_, seconds(o.timeout))));
    case Io::closed:
      fail_closing(fd_, CommError(fmt::format("the store at {} closed the connection before its greeting{}{}", where_,
                                 why.empty() ? "" : ": ", why)));
    case Io::done:
      break;
  }
  if (std::memcmp(greeting, kMagic.data(), kMagic.size()) != 0) {
    fail_closing(fd_, CommError(fmt::format("the process at {} is not an authenticated paratrain store (wrong greeting); set "
                               "the same PARATRAIN_JOB_TOKEN for every rank, rank 0 included", where_)));
  }
  Nonce server_nonce{};
  std::memcpy(server_nonce.data(), greeting + kMagic.size(), kNonceBytes);
  if (o.job_id.size() > kMaxJobIdBytes) {
    fail_closing(fd_, ConfigError(fmt::format("job id (TORCHELASTIC_RUN_ID) of {} bytes is longer than {}", o.job_id.size(),
                                 kMaxJobIdBytes)));
  }
  const Nonce client_nonce = random_nonce();
  const Mac mac = client_mac(o.token, server_nonce, client_nonce, o.job_id);
  std::vector<std::uint8_t> hello(kMagic.begin(), kMagic.end());
  hello.push_back(static_cast<std::uint8_t>(o.job_id.size() & 0xff));
  hello.push_back(static_cast<std::uint8_t>(o.job_id.size() >> 8));
  hello.insert(hello.end(), o.job_id.begin(), o.job_id.end());
  hello.insert(hello.end(), client_nonce.begin(), client_nonce.end());
  hello.insert(hello.end(), mac.begin(), mac.end());
  std::uint8_t verdict = 0xff;
  if (write_all(fd_, hello.data(), hello.size(), deadline, why) != Io::done ||
      read_exact(fd_, &verdict, 1, deadline, why) != Io::done) {
    fail_closing(fd_, CommError(fmt::format("the store at {} closed the connection during the handshake{}{}", where_,
                               why.empty() ? "" : ": ", why)));
  }
  switch (static_cast<Verdict>(verdict)) {
    case Verdict::admitted:
      break;
    case Verdict::wrong_token:
      fail_closing(fd_, CommError(fmt::format("the store at {} refused this process: wrong job token; is PARATRAIN_JOB_TOKEN "
                                 "that of this job?", where_)));
    case Verdict::wrong_job:
      fail_closing(fd_, CommError(fmt::format("the store at {} refused this process: it serves another job than '{}'; is "
                                 "TORCHELASTIC_RUN_ID (--rdzv-id) the same for every rank, and MASTER_PORT this "
                                 "job's?", where_, o.job_id)));
    default:
      fail_closing(fd_, CommError(fmt::format("the store at {} refused this process's handshake as malformed (verdict {}): is "
                                 "it a paratrain of the same version?", where_, verdict)));
  }
  Mac proof{};
  if (read_exact(fd_, proof.data(), proof.size(), deadline, why) != Io::done ||
      !equal(proof, server_mac(o.token, server_nonce, client_nonce, o.job_id))) {
    fail_closing(fd_, CommError(fmt::format("the store at {} could not prove it knows this job's token: another process may be "
                               "serving MASTER_PORT; not using it", where_)));
  }
}

AuthStore::~AuthStore() {
  if (fd_ >= 0) close(fd_);
}

c10::intrusive_ptr<c10d::Store> AuthStore::clone() {
  auto copy = c10::make_intrusive<AuthStore>(options_);
  copy->hold(owner_);
  return copy;
}

std::vector<uint8_t> AuthStore::request(const std::vector<uint8_t>& frame, std::chrono::milliseconds reply_within) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) throw CommError(fmt::format("the connection to the store at {} was lost earlier", where_));
  const Deadline deadline =
      reply_within <= std::chrono::milliseconds::zero() ? Deadline{} : Deadline{Clock::now() + reply_within + kReplyGrace};
  std::string why;
  auto lost = [&](Io io) {
    close(fd_);
    fd_ = -1;
    if (io == Io::timeout) {
      return CommError(fmt::format("the store at {} did not answer within {} s; is rank 0 (which serves it) "
                                   "stopped or overloaded?", where_, seconds(reply_within) + 30));
    }
    return CommError(fmt::format("lost the connection to the store at {}{}{}; rank 0 (which serves it) has "
                                 "probably exited", where_, why.empty() ? "" : ": ", why));
  };
  if (auto io = write_all(fd_, frame.data(), frame.size(), deadline, why); io != Io::done) throw lost(io);
  std::uint8_t len_bytes[4];
  if (auto io = read_exact(fd_, len_bytes, 4, deadline, why); io != Io::done) throw lost(io);
  const std::uint32_t len = load_u32(len_bytes);
  if (len == 0 || len > kMaxFrameBytes) {
    close(fd_);
    fd_ = -1;
    throw CommError(fmt::format("the store at {} sent a malformed reply ({} bytes)", where_, len));
  }
  std::vector<uint8_t> body(len);
  if (auto io = read_exact(fd_, body.data(), len, deadline, why); io != Io::done) throw lost(io);
  return body;
}

namespace {

// The reply's status, or CommError with the server's message.
Status status_of(Reader& r, const std::string& where) {
  const auto s = r.u8();
  if (!s || *s > static_cast<std::uint8_t>(Status::error))
    throw CommError(fmt::format("the store at {} sent a malformed reply", where));
  if (static_cast<Status>(*s) == Status::error) {
    throw CommError(fmt::format("the store at {}: {}", where, r.str().value_or("error")));
  }
  return static_cast<Status>(*s);
}

template <typename T>
T need(std::optional<T> v, const std::string& where) {
  if (!v) throw CommError(fmt::format("the store at {} sent a malformed reply", where));
  return std::move(*v);
}

}  // namespace

void AuthStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  Writer w;
  w.u8(static_cast<std::uint8_t>(Op::set));
  w.str(key);
  w.vec(value);
  auto body = request(w.frame(), timeout_);
  Reader r(body.data(), body.size());
  status_of(r, where_);
}

std::vector<uint8_t> AuthStore::compareSet(const std::string& key, const std::vector<uint8_t>& currentValue,
                                           const std::vector<uint8_t>& newValue) {
  Writer w;
  w.u8(static_cast<std::uint8_t>(Op::compare_set));
  w.str(key);
  w.vec(currentValue);
  w.vec(newValue);
  auto body = request(w.frame(), timeout_);
  Reader r(body.data(), body.size());
  status_of(r, where_);
  return need(r.vec(), where_);
}

std::vector<uint8_t> AuthStore::get(const std::string& key) {
  wait({key}, timeout_);
  Writer w;
  w.u8(static_cast<std::uint8_t>(Op::get));
  w.str(key);
  auto body = request(w.frame(), timeout_);
  Reader r(body.data(), body.size());
  if (status_of(r, where_) == Status::missing) {
    throw CommError(fmt::format("the store at {}: key '{}' was deleted while being read", where_, key));
  }
  return need(r.vec(), where_);
}

int64_t AuthStore::add(const std::string& key, int64_t value) {
  Writer w;
  w.u8(static_cast<std::uint8_t>(Op::add));
  w.str(key);
  w.i64(value);
  auto body = request(w.frame(), timeout_);
  Reader r(body.data(), body.size());
  status_of(r, where_);
  return need(r.i64(), where_);
}

bool AuthStore::deleteKey(const std::string& key) {
  Writer w;
  w.u8(static_cast<std::uint8_t>(Op::erase));
  w.str(key);
  auto body = request(w.frame(), timeout_);
  Reader r(body.data(), body.size());
  status_of(r, where_);
  return need(r.u8(), where_) != 0;
}

bool AuthStore::check(const std::vector<std::string>& keys) {
  Writer w;
  w.u8(static_cast<std::uint8_t>(Op::check));
  w.u32(static_cast<std::uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  auto body = request(w.frame(), timeout_);
  Reader r(body.data(), body.size());
  status_of(r, where_);
  return need(r.u8(), where_) != 0;
}

int64_t AuthStore::getNumKeys() {
  Writer w;
  w.u8(static_cast<std::uint8_t>(Op::num_keys));
  auto body = request(w.frame(), timeout_);
  Reader r(body.data(), body.size());
  status_of(r, where_);
  return need(r.i64(), where_);
}

void AuthStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void AuthStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  Writer w;
  w.u8(static_cast<std::uint8_t>(Op::wait));
  w.i64(std::max<std::int64_t>(timeout.count(), 0));
  w.u32(static_cast<std::uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  auto body = request(w.frame(), timeout);
  Reader r(body.data(), body.size());
  if (status_of(r, where_) == Status::timeout) {
    throw TimeoutError(fmt::format("waited {} s for key(s) {} in the store at {}; they never appeared",
                                   seconds(timeout), fmt::join(keys, ", "), where_));
  }
}

}  // namespace paratrain::comm::auth
