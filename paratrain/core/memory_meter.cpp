// The memory meter: see memory_meter.h.
#include "paratrain/core/memory_meter.h"

#include "paratrain/core/compat.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace paratrain::core {
namespace {

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};
std::atomic<int64_t> g_baseline{0};
std::atomic<bool> g_open{true};
std::atomic<bool> g_installed{false};

void raise_peak(int64_t live) {
  if (!g_open.load(std::memory_order_relaxed)) return;
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

// Each metered allocation's forwarded allocation (freed with it) and size,
// by address: the DataPtr's context is its data pointer, as LibTorch's
// raw_allocate() requires of an allocator with a raw deleter.
struct Allocation {
  c10::DataPtr inner;
  int64_t bytes = 0;
};
std::mutex g_mutex;
std::unordered_map<void*, Allocation>& allocations() {
  static auto* table = new std::unordered_map<void*, Allocation>();  // outlives every static tensor
  return *table;
}

void free_metered(void* data) {
  Allocation gone;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = allocations().find(data);
    if (it == allocations().end()) return;
    gone = std::move(it->second);
    allocations().erase(it);
  }
  g_live.fetch_sub(gone.bytes, std::memory_order_relaxed);
}  // `gone.inner` frees the memory through its own deleter

class MeteringAllocator final : public c10::Allocator {
 public:
  explicit MeteringAllocator(c10::Allocator* base) : base_(base) {}

  // LibTorch 2.x: allocate() is not const, and copy_data() is pure.
#if PARATRAIN_TORCH_AT_LEAST(2, 3)
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    base_->copy_data(dest, src, count);
  }
  c10::DataPtr allocate(size_t n) override {
#else
  c10::DataPtr allocate(size_t n) const override {
#endif
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    const c10::Device device = inner.device();
    if (data == nullptr) return inner;  // zero bytes: nothing to count
    const auto bytes = static_cast<int64_t>(n);
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      const bool fresh = allocations().emplace(data, Allocation{std::move(inner), bytes}).second;
      // Two live allocations at one address: the base allocator broke its
      // contract, and the second would be freed by the first's deleter.
      TORCH_CHECK(fresh, "memory meter: the CPU allocator returned the live address ", data, " twice");
    }
    raise_peak(g_live.fetch_add(bytes, std::memory_order_relaxed) + bytes);
    return {data, data, &free_metered, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_metered; }

 private:
  c10::Allocator* base_;
};

}  // namespace

void install_memory_meter() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Leaked on purpose: tensors freed at exit still call through it.
    static auto* meter = new MeteringAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(meter, /*priority=*/UINT8_MAX);
    g_installed = true;
  });
}

bool memory_meter_installed() { return g_installed.load(); }

MemoryMeterReading memory_meter() {
  return {g_live.load(std::memory_order_relaxed), g_baseline.load(std::memory_order_relaxed),
          g_peak.load(std::memory_order_relaxed)};
}

void count_external_bytes(int64_t delta) {
  if (!g_installed.load(std::memory_order_relaxed) || delta == 0) return;
  const int64_t live = g_live.fetch_add(delta, std::memory_order_relaxed) + delta;
  if (delta > 0) raise_peak(live);
}

void begin_memory_window() {
  const int64_t live = g_live.load(std::memory_order_relaxed);
  g_baseline.store(live, std::memory_order_relaxed);
  g_peak.store(live, std::memory_order_relaxed);
  g_open.store(true, std::memory_order_relaxed);
}

void end_memory_window() { g_open.store(false, std::memory_order_relaxed); }

}  // namespace paratrain::core
