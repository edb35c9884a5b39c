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

// torch::optim::Optimizer::state() is keyed by the parameter's TensorImpl:
// as the pointer printed to a string in 1.13, as the pointer itself in later
// 2.x. Read the key type off the map so no version number is guessed.
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include <torch/optim/optimizer.h>

namespace paratrain::compat {
using OptimizerStateKey =
    typename std::remove_cvref_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

// A template so the branch of the other version is discarded, not compiled.
template <typename Key = OptimizerStateKey>
Key optimizer_state_key(const at::Tensor& param) {
  if constexpr (std::is_same_v<Key, std::string>) {
    // As 1.13's c10::guts::to_string: the pointer through an ostream.
    std::ostringstream os;
    os << param.unsafeGetTensorImpl();
    return os.str();
  } else {
    return param.unsafeGetTensorImpl();
  }
}
}  // namespace paratrain::compat
