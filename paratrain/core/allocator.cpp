#include "paratrain/core/allocator.h"

#include <cstdlib>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace paratrain::core {

std::string retain_freed_memory() {
#if defined(__GLIBC__)
  for (const char* chosen : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"}) {
    if (std::getenv(chosen) != nullptr) return std::string("malloc: left as set by ") + chosen;
  }
  if (const char* m = std::getenv("PARATRAIN_MALLOC"); m != nullptr && std::string(m) == "system") {
    return "malloc: glibc defaults (PARATRAIN_MALLOC=system)";
  }
  // 32 MiB is glibc's largest mmap threshold on 64-bit; setting it also
  // stops glibc from moving the threshold itself.
  const bool ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1 && mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  return ok ? "malloc: freed memory kept for reuse (PARATRAIN_MALLOC=system for glibc defaults)"
            : "malloc: glibc refused the thresholds; defaults in use";
#else
  return "malloc: not glibc, left alone";
#endif
}

}  // namespace paratrain::core
