// CpuRngGuard: the default CPU generator's state, put back when the guard
// goes. Drawing a model only for its layout (adaptive freezing) or before
// loading its weights (a distillation teacher) reseeds the generator
// (builders.h); the guard keeps the run's own random stream (dropout) where
// it was, so a run with such a draw continues as one without it, and a
// resumed run as the uninterrupted one. Internal to paratrain/train.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>

#include <mutex>

namespace paratrain::train {

class CpuRngGuard {
 public:
  CpuRngGuard() {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    state_ = gen.get_state();
  }
  ~CpuRngGuard() {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state_);
  }
  CpuRngGuard(const CpuRngGuard&) = delete;
  CpuRngGuard& operator=(const CpuRngGuard&) = delete;

 private:
  at::Tensor state_;
};

}  // namespace paratrain::train
