// Symmetric memory of an shm group (ProcessGroup::allocate_symmetric): one
// /dev/shm segment per allocation holds every rank's copy side by side and
// every rank maps all of it, so a collective reads a peer's copy where it
// lies instead of copying it through the group's slots first. DDP's bucket
// buffers live here: backward writes gradients straight into shared memory
// and the all-reduce reduces them in place (shm_collectives.h,
// all_reduce_symmetric).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace c10d {
class Store;
}

namespace paratrain::comm::shm_detail {

class SymmetricBlock {
 public:
  // Collective over the ranks of `store`: rank 0 creates /dev/shm/<name>
  // with one copy of `bytes` per rank, publishes the name under `key`, waits
  // until every rank mapped it and unlinks it (Note [Unlink once mapped] in
  // shm_segment.cpp: a crash afterwards leaves nothing in /dev/shm). `id`
  // names the block in the per-operation shape check (Segment::OpShape).
  // Zero-filled. Throws CommError/TimeoutError naming the rank and the cause.
  SymmetricBlock(c10d::Store& store, const std::string& key, const std::string& name, uint64_t id, int rank,
                 int size, std::size_t bytes, std::chrono::milliseconds timeout);
  ~SymmetricBlock();
  SymmetricBlock(const SymmetricBlock&) = delete;
  SymmetricBlock& operator=(const SymmetricBlock&) = delete;

  uint64_t id() const { return id_; }
  std::size_t bytes() const { return bytes_; }  // of one rank's copy
  // Rank r's copy (bytes() bytes).
  char* copy_of(int r) const;
  // The offset of [p, p + n) inside this rank's copy, or nullopt when it
  // does not lie entirely inside it.
  std::optional<std::size_t> offset_in_mine(const void* p, std::size_t n) const;

 private:
  uint64_t id_;
  int rank_, size_;
  std::size_t bytes_, stride_, mapped_bytes_;
  void* base_ = nullptr;
  bool metered_ = false;  // counted in the memory meter (installed when mapped): uncounted when unmapped
};

}  // namespace paratrain::comm::shm_detail
