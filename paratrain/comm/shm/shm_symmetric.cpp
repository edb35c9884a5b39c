// Symmetric blocks of the shm backend; see shm_symmetric.h.
#include "paratrain/comm/shm/shm_symmetric.h"

#include <sys/mman.h>

#include <atomic>
#include <new>
#include <vector>

#include <fmt/format.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "paratrain/comm/shm/shm_map.h"
#include "paratrain/core/memory_meter.h"

namespace paratrain::comm::shm_detail {
namespace {

// Each copy starts on its own page, so ranks writing their own copies never
// share a cache line and the kernel can back them independently.
constexpr std::size_t kPage = 4096;

// The first page of the segment: how many ranks mapped it (rank 0 unlinks at
// size) at byte 0, and from byte 64 one flag per rank saying which did (for
// the timeout's message).
std::atomic<uint32_t>& mapped_count(void* base) { return *static_cast<std::atomic<uint32_t>*>(base); }
std::atomic<uint8_t>& mapped_flag(void* base, int r) {
  return reinterpret_cast<std::atomic<uint8_t>*>(static_cast<char*>(base) + 64)[r];
}

std::size_t round_up(std::size_t n) { return (n + kPage - 1) / kPage * kPage; }

}  // namespace

SymmetricBlock::SymmetricBlock(c10d::Store& store, const std::string& key, const std::string& name, uint64_t id,
                               int rank, int size, std::size_t bytes, std::chrono::milliseconds timeout)
    : id_(id), rank_(rank), size_(size), bytes_(bytes), stride_(round_up(bytes == 0 ? 1 : bytes)) {
  static_assert(sizeof(std::atomic<uint8_t>) == 1 && std::atomic<uint32_t>::is_always_lock_free);
  TORCH_CHECK(64 + static_cast<std::size_t>(size_) <= kPage, "shm: too many ranks (", size_,
              ") for a symmetric block's header page");
  mapped_bytes_ = kPage + stride_ * static_cast<std::size_t>(size_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string shm_name;
  if (rank_ == 0) {
    shm_name = name;
    base_ = create_mapping(shm_name, mapped_bytes_);
    store.set(key, std::vector<uint8_t>(shm_name.begin(), shm_name.end()));
  } else {
    const auto value = store.get(key);
    shm_name.assign(value.begin(), value.end());
    base_ = open_mapping(shm_name, mapped_bytes_, rank_);
  }
  // A fresh segment is zero-filled, so the header's atomics start at 0.
  mapped_flag(base_, rank_).store(1);
  mapped_count(base_).fetch_add(1);
  // This rank's copy is its tensor storage (the meter of `paratrain plan
  // --measure`); the peers' copies are theirs.
  metered_ = core::memory_meter_installed();
  if (metered_) core::count_external_bytes(static_cast<int64_t>(bytes_));
  if (rank_ != 0) return;
  try {
    unlink_once_mapped(
        shm_name, [&] { return mapped_count(base_).load() >= static_cast<uint32_t>(size_); }, deadline,
        [&] {
          std::string missing;
          for (int r = 0; r < size_; ++r)
            if (mapped_flag(base_, r).load() == 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
          return fmt::format("rank 0: ranks [{}] did not map the symmetric block /dev/shm/{} within {} ms: they "
                             "did not call allocate_symmetric (every rank must, with the same sizes), died, or run "
                             "on another host",
                             missing, shm_name, timeout.count());
        });
  } catch (...) {
    munmap(base_, mapped_bytes_);
    if (metered_) core::count_external_bytes(-static_cast<int64_t>(bytes_));
    base_ = nullptr;
    throw;
  }
}

SymmetricBlock::~SymmetricBlock() {
  if (base_ == nullptr) return;
  munmap(base_, mapped_bytes_);
  if (metered_) core::count_external_bytes(-static_cast<int64_t>(bytes_));
}

char* SymmetricBlock::copy_of(int r) const {
  return static_cast<char*>(base_) + kPage + stride_ * static_cast<std::size_t>(r);
}

std::optional<std::size_t> SymmetricBlock::offset_in_mine(const void* p, std::size_t n) const {
  const auto* b = copy_of(rank_);
  const auto* q = static_cast<const char*>(p);
  if (q < b || q + n > b + bytes_) return std::nullopt;
  return static_cast<std::size_t>(q - b);
}

}  // namespace paratrain::comm::shm_detail
