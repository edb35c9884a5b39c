// The segment and its phase barrier; see shm_segment.h.
#include "paratrain/comm/shm/shm_segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <new>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "paratrain/comm/shm/shm_map.h"
#include "paratrain/core/error.h"

namespace paratrain::comm::shm_detail {
namespace {

constexpr std::size_t kLine = 64;
constexpr uint64_t kMagic = 0x70617261'73686d32ULL;  // "parashm2" (layout version 2: OpShape)

enum State : uint32_t { kLive = 0, kFailed = 1, kAborted = 2 };

struct alignas(kLine) Header {
  uint64_t magic;
  int32_t size;
  uint64_t chunk_bytes;
  std::atomic<uint32_t> mapped;    // ranks that mapped the segment (rank 0 unlinks at size)
  std::atomic<uint32_t> sleepers;  // ranks asleep in a futex: arrivals wake them only if > 0
};

struct alignas(kLine) Control {
  std::atomic<uint32_t> phase;  // phases this rank completed; the futex word
  std::atomic<int32_t> pid;     // 0 until the rank mapped the segment
  std::atomic<uint32_t> state;  // State
  // The shape of this rank's current all_reduce (Segment::OpShape).
  std::atomic<uint64_t> op_block, op_offset, op_bytes;
};

static_assert(std::atomic<uint32_t>::is_always_lock_free && sizeof(std::atomic<uint32_t>) == 4);

std::size_t layout_bytes(int size, std::size_t chunk) {
  return sizeof(Header) + size * sizeof(Control) + static_cast<std::size_t>(size) * 2 * chunk;
}

Header& header(void* base) { return *static_cast<Header*>(base); }
Control& control(void* base, int r) {
  return reinterpret_cast<Control*>(static_cast<char*>(base) + sizeof(Header))[r];
}

void futex_wait(std::atomic<uint32_t>& word, uint32_t seen, std::chrono::microseconds at_most) {
  timespec ts{0, static_cast<long>(at_most.count()) * 1000};
  // Not FUTEX_PRIVATE: the word lives in memory shared between processes.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}
void futex_wake(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

// A process that exited but was not yet reaped still answers kill(pid, 0):
// read its state from /proc so a dead child of a slow parent counts as dead.
bool process_alive(int32_t pid) {
  if (pid <= 0) return true;  // not mapped yet: only the timeout can tell
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(stat, line)) return true;  // no /proc: trust kill()
  const auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return true;
  const char st = line[close + 2];
  return st != 'Z' && st != 'X';
}

}  // namespace

std::string segment_name(const std::string& job, const std::string& group, uint64_t nonce) {
  auto clean = [](std::string s) {
    for (char& c : s)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) c = '_';
    return s.substr(0, 80);
  };
  return fmt::format("paratrain-shm.{}.{}.{:x}", clean(job), clean(group), nonce);
}

Segment::Segment(c10d::Store& store, const std::string& key, const std::string& name, int rank, int size,
                 std::size_t chunk_bytes, std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), chunk_bytes_(chunk_bytes), bytes_(layout_bytes(size, chunk_bytes)) {
  TORCH_CHECK(chunk_bytes_ >= kLine && chunk_bytes_ % kLine == 0, "shm: chunk_bytes (", chunk_bytes_,
              ") must be a positive multiple of ", kLine);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  if (rank_ == 0) {
    name_ = name;
    base_ = create_mapping(name_, bytes_);
    // A fresh segment is zero-filled: counters start at 0, states live.
    auto* h = new (base_) Header{};
    h->magic = kMagic;
    h->size = size_;
    h->chunk_bytes = chunk_bytes_;
    for (int r = 0; r < size_; ++r) new (&control(base_, r)) Control{};
    std::atomic_thread_fence(std::memory_order_seq_cst);
    store.set(key, std::vector<uint8_t>(name_.begin(), name_.end()));
  } else {
    // Blocks until rank 0 published the name (bounded by the store's timeout).
    const auto value = store.get(key);
    name_.assign(value.begin(), value.end());
    base_ = open_mapping(name_, bytes_, rank_);
    if (header(base_).magic != kMagic || header(base_).size != size_ || header(base_).chunk_bytes != chunk_bytes_) {
      munmap(base_, bytes_);
      base_ = nullptr;
      throw CommError(fmt::format("rank {}: /dev/shm/{} does not hold a segment of {} ranks with chunks of {} "
                                  "bytes: ranks disagree on the group or its options (or run different builds)",
                                  rank_, name_, size_, chunk_bytes_));
    }
  }
  control(base_, rank_).pid.store(static_cast<int32_t>(getpid()));
  header(base_).mapped.fetch_add(1);
  if (rank_ != 0) return;
  try {
    unlink_once_mapped(
        name_, [&] { return header(base_).mapped.load() >= static_cast<uint32_t>(size_); }, deadline,
        [&] {
          std::string missing;
          for (int r = 0; r < size_; ++r)
            if (control(base_, r).pid.load() == 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
          return fmt::format("rank 0: ranks [{}] did not map the shared-memory segment /dev/shm/{} within {} ms: "
                             "they never started, died, or run on another host",
                             missing, name_, timeout.count());
        });
  } catch (...) {
    munmap(base_, bytes_);
    base_ = nullptr;
    throw;
  }
}

Segment::~Segment() {
  if (base_ != nullptr) munmap(base_, bytes_);
}

char* Segment::slot(int r, uint64_t chunk) const {
  char* data = static_cast<char*>(base_) + sizeof(Header) + size_ * sizeof(Control);
  return data + (static_cast<std::size_t>(r) * 2 + chunk % 2) * chunk_bytes_;
}

void Segment::publish(const OpShape& shape) {
  Control& c = control(base_, rank_);
  c.op_block.store(shape.block);
  c.op_offset.store(shape.offset);
  c.op_bytes.store(shape.bytes);
}

Segment::OpShape Segment::shape_of(int r) const {
  const Control& c = control(base_, r);
  return OpShape{c.op_block.load(), c.op_offset.load(), c.op_bytes.load()};
}

void Segment::mark_failed() {
  if (base_ != nullptr) control(base_, rank_).state.store(kFailed);
}
void Segment::mark_aborted() {
  if (base_ != nullptr) control(base_, rank_).state.store(kAborted);
}

// Note [Shm phases]: every operation is a sequence of phases; in each, a
// rank writes only its own slot (or its own sub-slice of a shared result),
// then bumps its counter and waits for every peer's counter to reach the
// same phase. A peer's counter is written by that peer alone, so the wait
// names who is late. Chunks alternate between the two halves of each slot:
// a rank can only reuse half h after passing the next phase, which every
// peer reaches only after it finished reading half h.
void Segment::arrive_and_wait(const WaitContext& ctx) {
  ++phase_;
  control(base_, rank_).phase.store(phase_);
  if (header(base_).sleepers.load() > 0) futex_wake(control(base_, rank_).phase);
  for (int r = 0; r < size_; ++r)
    if (r != rank_) wait_for(r, phase_, ctx);
}

// Spins briefly (peers usually arrive within microseconds when all of them
// are inside the same collective), then sleeps on the peer's counter in
// short futex waits: a spinning waiter would take the core its own rank's
// compute thread needs on a machine with as many ranks as cores.
void Segment::wait_for(int peer, uint32_t target, const WaitContext& ctx) {
  Control& c = control(base_, peer);
  const auto reached = [&] { return static_cast<int32_t>(c.phase.load() - target) >= 0; };
  const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
  while (std::chrono::steady_clock::now() < spin_until) {
    if (reached()) return;
    std::this_thread::yield();
  }
  auto next_pid_check = std::chrono::steady_clock::now();
  while (true) {
    const uint32_t seen = c.phase.load();
    if (static_cast<int32_t>(seen - target) >= 0) return;
    const auto st = c.state.load();
    if (st != kLive)
      throw CommError(fmt::format("{}: rank {} {} the group while this rank waited for it; this operation cannot "
                                  "complete. Rebuild the group (the job must restart)",
                                  *ctx.what, peer, st == kAborted ? "aborted (or left)" : "failed in an earlier operation of"));
    if (ctx.aborted && ctx.aborted())
      throw CommError(fmt::format("{}: the group was aborted while this operation was in flight", *ctx.what));
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_pid_check) {
      const int32_t pid = c.pid.load();
      if (!process_alive(pid))
        throw CommError(fmt::format("{}: rank {} (pid {}) died while this rank waited for it in shared memory; "
                                    "this operation cannot complete. The job must restart",
                                    *ctx.what, peer, pid));
      next_pid_check = now + std::chrono::milliseconds(100);
    }
    if (ctx.deadline.passed(now))
      throw TimeoutError(fmt::format("{} did not complete within the timeout: rank {} (pid {}) never arrived at "
                                     "phase {}; it may be stopped, hung, or skipped this operation",
                                     *ctx.what, peer, c.pid.load(), target));
    header(base_).sleepers.fetch_add(1);
    futex_wait(c.phase, seen, std::chrono::microseconds(2000));
    header(base_).sleepers.fetch_sub(1);
  }
}

}  // namespace paratrain::comm::shm_detail
