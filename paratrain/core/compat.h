// The one place where LibTorch 1.13 (Debian, CPU) and 2.x (CUDA wheels)
// differ for us. Everything else includes this instead of testing versions.
#pragma once

#include <torch/version.h>

#define PARATRAIN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||            \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// In 2.x c10d backends (ProcessGroupGloo, ProcessGroupNCCL) derive from
// c10d::Backend; in 1.13 they derive from c10d::ProcessGroup. We only call
// methods both share, through this alias.
#if PARATRAIN_TORCH_AT_LEAST(2, 0)
#include <torch/csrc/distributed/c10d/Backend.hpp>
namespace paratrain::compat {
using C10dBackend = ::c10d::Backend;
}
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
namespace paratrain::compat {
using C10dBackend = ::c10d::ProcessGroup;
}
#endif
