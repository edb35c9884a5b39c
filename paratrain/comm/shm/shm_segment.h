// The shared-memory segment of one shm process group, and the phase barrier
// its ranks synchronize with. Not a ProcessGroup (that is shm_group.h): this
// file only maps memory, counts arrivals and notices dead or departed peers.
//
// Layout: a header (magic, world size, chunk size, mapped and sleeper counts),
// one control block per rank (its phase counter, pid and state, each on its
// own cache line so ranks never write the same line), then one data slot per
// rank of 2 * chunk_bytes: chunk k of any operation uses half k % 2, so a
// fast rank can fill the next chunk while a slow one still reads this one.
// See Note [Shm phases] in shm_segment.cpp.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "paratrain/core/running_deadline.h"

namespace c10d {
class Store;
}

namespace paratrain::comm::shm_detail {

// Why a wait for peers stopped early.
struct WaitContext {
  std::function<bool()> aborted;  // this rank aborted the group
  // world.timeout_s of running time (Note [Deadlines that stop with the
  // process]): every wait of the operation looks at it and moves it on.
  mutable RunningDeadline deadline{std::chrono::milliseconds(0)};
  const std::string* what = nullptr;  // "rank 0: all_reduce(1000 Float)", for errors
};

class Segment {
 public:
  // Collective over the ranks meeting in `store`: rank 0 creates the segment
  // /dev/shm/<name>, publishes the name under `key`, waits until every rank
  // mapped it and unlinks it, so nothing is left behind even if a rank later
  // crashes. Throws CommError/TimeoutError naming the missing ranks.
  Segment(c10d::Store& store, const std::string& key, const std::string& name, int rank, int size,
          std::size_t chunk_bytes, std::chrono::milliseconds timeout);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::size_t chunk_bytes() const { return chunk_bytes_; }
  const std::string& name() const { return name_; }

  // Half `chunk % 2` of rank r's slot: chunk_bytes() bytes.
  char* slot(int r, uint64_t chunk) const;

  // Announces that this rank finished its part of the current phase and
  // waits until every rank did (a barrier on the counters, in phase order).
  // Throws CommError when a peer died, aborted or failed, TimeoutError at the
  // deadline naming the ranks that never arrived, CommError on local abort.
  void arrive_and_wait(const WaitContext& ctx);

  // What an all_reduce works on, published by each rank before the
  // operation's first phase and compared after it: every rank must reduce
  // the same number of bytes, and either all through the slots (block 0) or
  // all in place in the same symmetric block at the same offset (block =
  // SymmetricBlock::id()). A mismatch would otherwise read garbage or leave
  // the phases out of step; with the check it is a CommError naming the rank.
  struct OpShape {
    uint64_t block = 0, offset = 0, bytes = 0;
    bool operator==(const OpShape&) const = default;
  };
  // Only between operations' first phases (Note [Shm phases]): a peer reads
  // it after that phase and before the next, while this rank cannot get
  // past the next one.
  void publish(const OpShape& shape);
  OpShape shape_of(int r) const;

  // Marks this rank as failed or aborted, so peers waiting on it fail at
  // once instead of at their timeout. A group's destructor marks it aborted
  // too: peers still waiting on it fail ("aborted (or left)"), those past
  // its last phase never look.
  void mark_failed();
  void mark_aborted();

 private:
  void wait_for(int peer, uint32_t target, const WaitContext& ctx);

  int rank_ = 0, size_ = 1;
  std::size_t chunk_bytes_ = 0;
  std::size_t bytes_ = 0;
  std::string name_;
  void* base_ = nullptr;
  uint32_t phase_ = 0;  // phases this rank completed
};

// A name for /dev/shm made of the parts (any characters outside
// [A-Za-z0-9._-] become '_'), prefixed "paratrain-shm." so the leak test
// and a user can find the job's segments.
std::string segment_name(const std::string& job, const std::string& group, uint64_t nonce);

}  // namespace paratrain::comm::shm_detail
