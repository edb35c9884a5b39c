// The ranks' heartbeat watch over UDP (see peer_watch.h).
#include "paratrain/comm/peer_watch.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "paratrain/comm/doctor/recording_group.h"
#include "paratrain/core/error.h"
#include "paratrain/core/process_state.h"

namespace paratrain::comm {
namespace {

// Note [Peer heartbeats over UDP]
// Why not the store: in a hand-started job (and under mpirun/srun) rank 0
// serves the store from a thread of its own process, so a stopped rank 0
// takes every rank's heartbeats down with it, and the survivors' store calls
// block instead of telling them who stopped. Under an agent store (the
// launcher's, torchrun's) the store host is a different single point: a node
// cut off from it would blame everyone. Beats sent straight from rank to
// rank need nothing but the peer itself: whoever stops, the others still hear
// each other, and whoever is cut off by the network is silent to exactly the
// ranks it lost. UDP, not TCP: a beat that arrives late is worthless, a lost
// one is repaired by the next (the timeout is at least two intervals), and a
// socket that cannot deliver never blocks the sender (MSG_DONTWAIT). The
// addresses are exchanged by one all_gather over the group itself, so this
// works with every store and with the MPI backend. A forged beat (anyone can
// send UDP) can only keep a dead peer looking alive, which falls back to
// world.timeout_s; a per-job nonce keeps another job's beats apart.

constexpr std::size_t kRecord = 512;  // bytes per rank in the address exchange
constexpr const char* kMagic = "PTBEAT1";

std::string this_host() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return host;
}

std::string random_nonce() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}", rd(), rd());
}

std::vector<std::string> split(const std::string& s, char sep, std::size_t max_fields) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (out.size() + 1 < max_fields) {
    const auto at = s.find(sep, start);
    if (at == std::string::npos) break;
    out.push_back(s.substr(start, at - start));
    start = at + 1;
  }
  out.push_back(s.substr(start));
  return out;
}

addrinfo* resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || res == nullptr)
    throw CommError(fmt::format("peer heartbeats: cannot resolve '{}': {}", host, gai_strerror(rc)));
  return res;
}

std::string numeric_host(const sockaddr* sa, socklen_t len, int* port) {
  char host[NI_MAXHOST] = {0}, serv[NI_MAXSERV] = {0};
  if (getnameinfo(sa, len, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) != 0) return "";
  *port = std::atoi(serv);
  return host;
}

}  // namespace

PeerWatch::PeerWatch(ProcessGroup& group, PeerWatchOptions options) : group_(group), options_(std::move(options)) {
  if (options_.timeout < 2 * options_.interval)
    throw ConfigError(fmt::format("peer heartbeats: the timeout ({} ms) must be at least twice the interval ({} ms), "
                                  "or one late beat would count as a stopped rank",
                                  options_.timeout.count(), options_.interval.count()));
  addrinfo* local = resolve(options_.bind_address, 0, true);
  socket_ = socket(local->ai_family, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (socket_ < 0 || bind(socket_, local->ai_addr, local->ai_addrlen) != 0 || pipe2(stop_pipe_, O_CLOEXEC) != 0) {
    const std::string why = std::strerror(errno);
    freeaddrinfo(local);
    if (socket_ >= 0) close(socket_);
    throw CommError(fmt::format("peer heartbeats: rank {} cannot listen on {}: {}", group_.rank(),
                                options_.bind_address, why));
  }
  freeaddrinfo(local);
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof bound;
  getsockname(socket_, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  int port = 0;
  std::string address = numeric_host(reinterpret_cast<sockaddr*>(&bound), bound_len, &port);

  // The exchange: "address\tport\tpid\thost\tnonce" per rank, NUL-padded.
  const std::string mine = fmt::format("{}\t{}\t{}\t{}\t{}", address, port, static_cast<long long>(getpid()),
                                       this_host(), random_nonce());
  auto input = at::zeros({static_cast<int64_t>(kRecord)}, at::kByte);
  std::memcpy(input.data_ptr<uint8_t>(), mine.data(), std::min(mine.size(), kRecord - 1));
  auto output = at::zeros({static_cast<int64_t>(kRecord) * group_.size()}, at::kByte);
  group_.all_gather(output, input)->wait();
  const auto* bytes = reinterpret_cast<const char*>(output.data_ptr<uint8_t>());
  for (int r = 0; r < group_.size(); ++r) {
    const std::string record(bytes + r * kRecord, strnlen(bytes + r * kRecord, kRecord));
    const auto f = split(record, '\t', 5);
    if (f.size() != 5) throw CommError(fmt::format("peer heartbeats: rank {} sent a malformed address", r));
    peers_.push_back(PeerInfo{r, std::atoll(f[2].c_str()), f[3], f[0], std::atoi(f[1].c_str())});
    if (r == 0) nonce_ = f[4];
  }
  for (const auto& p : peers_) {
    addrinfo* to = resolve(p.address, p.port, false);
    sockaddr_storage a{};
    std::memcpy(&a, to->ai_addr, to->ai_addrlen);
    to_.emplace_back(a, static_cast<socklen_t>(to->ai_addrlen));
    freeaddrinfo(to);
  }
  seen_.resize(peers_.size());
  for (auto& s : seen_) s.at = std::chrono::steady_clock::now();  // everyone was alive at the exchange
  thread_ = std::thread([this] { loop(); });
}

PeerWatch::~PeerWatch() {
  const char byte = 0;
  [[maybe_unused]] ssize_t n = write(stop_pipe_[1], &byte, 1);
  if (thread_.joinable()) thread_.join();
  send_beats("exiting");
  for (int fd : {socket_, stop_pipe_[0], stop_pipe_[1]}) {
    if (fd >= 0) close(fd);
  }
}

std::optional<std::string> PeerWatch::verdict() const {
  std::lock_guard<std::mutex> lock(verdict_mu_);
  return verdict_;
}

std::string PeerWatch::name_peers_in(const std::string& message) const {
  std::string out;
  std::vector<std::string> done;
  for (const auto& p : peers_) {
    if (p.rank == group_.rank() || p.address == peers_[static_cast<std::size_t>(group_.rank())].address) continue;
    if (message.find("[" + p.address + "]") == std::string::npos) continue;
    if (std::find(done.begin(), done.end(), p.address) != done.end()) continue;
    done.push_back(p.address);
    std::vector<int> ranks;
    for (const auto& q : peers_) {
      if (q.address == p.address) ranks.push_back(q.rank);
    }
    out += fmt::format(" ([{}] is rank{} {} on host {})", p.address, ranks.size() == 1 ? "" : "s",
                       fmt::join(ranks, ", "), p.host);
  }
  return out;
}

void PeerWatch::loop() {
  using Clock = std::chrono::steady_clock;
  auto next_beat = Clock::now();
  auto last_turn = Clock::now();
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next_beat - Clock::now());
    pollfd fds[2] = {{stop_pipe_[0], POLLIN, 0}, {socket_, POLLIN, 0}};
    const int ready = poll(fds, 2, static_cast<int>(std::max<int64_t>(0, left.count())));
    if (ready < 0 && errno != EINTR) return;
    if (fds[0].revents != 0) return;
    receive();  // everything queued first: beats that came while this thread waited are not missed
    const auto now = Clock::now();
    // This process itself was stopped (SIGSTOP then SIGCONT, a debugger, a
    // suspended machine): its peers' silence is its own. Start afresh.
    if (now - last_turn > options_.timeout) {
      for (auto& s : seen_) s.at = now;
    }
    last_turn = now;
    if (now >= next_beat) {
      if (beating_.load()) send_beats("running");
      next_beat = now + options_.interval;
    }
    judge(now);
  }
}

// A beat: "PTBEAT1\t<nonce>\t<rank>\t<beat>\t<state>\t<last op>", one
// datagram per peer. The last op is this rank's flight recorder's summary:
// what a peer names when this rank goes silent after it.
void PeerWatch::send_beats(const char* state) {
  const int64_t n = beats_.fetch_add(1) + 1;
  std::string last_op = "unknown (no flight recorder: world.doctor_records = 0)";
  if (auto recorder = recorder_of(group_)) last_op = recorder->last_op();
  if (last_op.size() > 400) last_op.resize(400);
  const std::string msg = fmt::format("{}\t{}\t{}\t{}\t{}\t{}", kMagic, nonce_, group_.rank(), n, state, last_op);
  for (const auto& p : peers_) {
    if (p.rank == group_.rank()) continue;
    const auto& [to, len] = to_[static_cast<std::size_t>(p.rank)];
    // MSG_DONTWAIT: a full buffer loses this beat, never blocks the watch.
    [[maybe_unused]] ssize_t sent =
        sendto(socket_, msg.data(), msg.size(), MSG_DONTWAIT, reinterpret_cast<const sockaddr*>(&to), len);
  }
}

void PeerWatch::receive() {
  char buf[2048];
  while (true) {
    const ssize_t got = recv(socket_, buf, sizeof buf, MSG_DONTWAIT);
    if (got <= 0) return;
    const auto f = split(std::string(buf, static_cast<std::size_t>(got)), '\t', 6);
    if (f.size() != 6 || f[0] != kMagic || f[1] != nonce_) continue;  // not a beat of this job
    const int r = std::atoi(f[2].c_str());
    if (r < 0 || r >= static_cast<int>(seen_.size()) || r == group_.rank()) continue;
    Seen& s = seen_[static_cast<std::size_t>(r)];
    s.at = std::chrono::steady_clock::now();
    s.beat = std::atoll(f[3].c_str());
    s.last_op = f[5];
    if (f[4] == "exiting") s.exited = true;
  }
}

void PeerWatch::judge(std::chrono::steady_clock::time_point now) {
  if (verdict()) return;  // one verdict: the group is aborted once
  std::vector<std::string> silent;
  for (const auto& p : peers_) {
    const Seen& s = seen_[static_cast<std::size_t>(p.rank)];
    if (p.rank == group_.rank() || s.exited || now - s.at <= options_.timeout) continue;
    // /proc tells a stopped process from a frozen machine only on this host.
    std::string state = "another host: stopped, frozen or cut off by the network";
    if (p.host == this_host() && p.pid == static_cast<long long>(getpid())) {
      state = "a rank of this very process (ranks as threads): its watch stopped beating";
    } else if (p.host == this_host()) {
      const std::string ps = process_state(static_cast<pid_t>(p.pid));
      state = "the process is " + ps;
      // Alive on this host, yet silent: its beats are lost on the way (a cut
      // network between namespaces) or its watch thread gets no CPU.
      if (ps == "running" || ps == "sleeping") state += ", yet its beats do not arrive (network, or a starved thread)";
    }
    silent.push_back(fmt::format(
        "rank {} (pid {} on host {}, {}) sent no heartbeat for {:.1f} s (world.heartbeat_timeout_s = {:g} s; {}); "
        "its last collective: {}",
        p.rank, p.pid, p.host, p.address, std::chrono::duration<double>(now - s.at).count(),
        std::chrono::duration<double>(options_.timeout).count(), state, s.last_op));
  }
  if (silent.empty()) return;
  std::string message = "peer heartbeats: ";
  for (std::size_t i = 0; i < silent.size(); ++i) message += (i > 0 ? "; " : "") + silent[i];
  message += fmt::format("; rank {} {}", group_.rank(),
                         options_.abort_group ? "aborts its process group" : "goes on waiting (abort off)");
  {
    std::lock_guard<std::mutex> lock(verdict_mu_);
    verdict_ = message;
  }
  spdlog::error("{}", message);
  // As on a collective timeout: this rank's records go to the doctor's
  // folder before its collective fails (RecordingGroup dumps on timeouts).
  auto recorder = recorder_of(group_);
  if (recorder) recorder->dump("peer heartbeat lost");
  if (!options_.abort_group) return;
  if (recorder) recorder->set_abort_reason(fmt::format("rank {}: {}", group_.rank(), message));
  group_.abort();
}

}  // namespace paratrain::comm
