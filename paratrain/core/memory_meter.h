// The memory meter: bytes of tensor storage live on the CPU, counted at
// LibTorch's CPU allocator, now and at the peak. What `paratrain plan
// --measure` compares the planner's prediction with. Not an allocator of
// its own (it forwards to LibTorch's) and not a profiler (no events: two
// counters). Off unless a program installs it first thing: storage
// allocated before install_memory_meter() is not counted, and its frees are
// not seen.
//
//   core::install_memory_meter();
//   ... build, train ...
//   core::MemoryMeterReading r = core::memory_meter();   // r.peak_bytes - r.baseline_bytes
#pragma once

#include <cstdint>

namespace paratrain::core {

/// Makes every later CPU tensor allocation go through the meter
/// (c10::SetCPUAllocator with the highest priority, forwarding to the
/// allocator that was in place). Idempotent; process-wide; thread-safe.
void install_memory_meter();

/// Whether install_memory_meter() ran in this process.
bool memory_meter_installed();

struct MemoryMeterReading {
  int64_t live_bytes = 0;      ///< storage bytes allocated through the meter and not yet freed
  int64_t baseline_bytes = 0;  ///< live_bytes when the window opened
  int64_t peak_bytes = 0;      ///< the most live_bytes reached inside the window
};

/// The meter now (zeros when it is not installed).
MemoryMeterReading memory_meter();

/// Counts `delta` bytes of tensor storage that LibTorch's allocator does not
/// see (positive when mapped, negative when unmapped), as if allocated or
/// freed through it: an shm group's symmetric buffers (DDP's and ZeRO-1's
/// gradient buckets, comm/shm/shm_symmetric.h) count this rank's copy.
/// A no-op unless the meter is installed.
void count_external_bytes(int64_t delta);

/// Opens the window the peak is taken over (installing opens one at 0):
/// baseline and peak become the bytes live now. The Trainer opens it once
/// its data is loaded, before the model is built.
void begin_memory_window();

/// Closes the window: the peak stays as it is (the Trainer closes it when
/// training ends, before the last checkpoint and evaluation).
void end_memory_window();

}  // namespace paratrain::core
