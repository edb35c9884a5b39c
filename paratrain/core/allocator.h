// Process-wide malloc settings for training. LibTorch's CPU tensors come
// straight from malloc, and glibc gives freed blocks of 128 KiB and more back
// to the kernel (munmap, or trimming the heap top). A training step frees and
// reallocates the same activations and gradients every time, so each step
// page-faults and zero-fills them again. Measured on this CPU, one process,
// the Fashion-MNIST CNN: 1550-1700 samples/s with glibc's defaults, 1900-2050
// with freed memory kept (~1.2x) on a quiet machine; under load from other
// processes the kernel's share grows and the gap with it (600 vs 2100-2600).
//
// A library must not change process-global state behind a caller's back, so
// nothing calls this implicitly: programs (the paratrain CLI, the benches,
// the test main) call it first thing.
#pragma once

#include <string>

namespace paratrain::core {

// Keeps freed memory in the process for reuse: blocks below 32 MiB come from
// the heap (not mmap) and the heap is trimmed only past 1 GiB of free top.
// The resident size stays near the peak, as with any caching allocator.
// Does nothing when the user already chose (MALLOC_MMAP_THRESHOLD_,
// MALLOC_TRIM_THRESHOLD_ or GLIBC_TUNABLES is set) or PARATRAIN_MALLOC=system.
// Returns what it did, for a log line.
std::string retain_freed_memory();

}  // namespace paratrain::core
