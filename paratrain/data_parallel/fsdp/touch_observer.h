// The pre-operation hook LibTorch's C++ modules lack: a listener registered
// for the calling thread sees every dispatcher operation (and every autograd
// node) just before it runs, with its inputs. FSDP uses it to gather a unit
// the moment an operation is about to read its parameters. Built on
// RecordFunction's thread-local callbacks; see Note [Gather on touch] in
// fsdp.cpp for the reasons and costs. Not here: what the listener does.
#pragma once

#include <memory>

namespace at {
class RecordFunction;
}

namespace paratrain::fsdp {

class TouchListener {
 public:
  virtual ~TouchListener() = default;
  // Runs on the thread the operation runs on, before the operation. Must not
  // throw (RecordFunction would swallow it): keep an error and report it later.
  // Operations the listener itself runs are not reported back to it.
  virtual void on_operation(const at::RecordFunction& fn) noexcept = 0;
};

// From now on, operations on the calling thread are reported to `listener`
// until it is destroyed (held weakly). Registering the same listener twice on
// one thread is a no-op. Threads the autograd engine starts (CUDA devices)
// are not covered: CPU backward runs on the thread that called backward();
// see observe_engine_threads.
void observe_this_thread(const std::shared_ptr<TouchListener>& listener);

// Also report to `listener` the operations of threads that have no listener
// of their own but run with an observed thread's callbacks: the autograd
// engine's device threads, where a GPU backward runs (Note [Backward on the
// engine's device threads]). For a process that trains on GPUs; held weakly.
void observe_engine_threads(const std::shared_ptr<TouchListener>& listener);

// When every listener of the calling thread is gone, removes the callback, so
// the thread stops paying RecordFunction's per-operation boxing of inputs.
// Call it after a listener is destroyed (on another thread it does nothing
// for the listener's thread, which keeps a callback that finds no listener).
void release_idle_observer();

}  // namespace paratrain::fsdp
