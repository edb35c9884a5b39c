// observe_this_thread: one RecordFunction thread-local callback per thread,
// fanned out to that thread's live listeners. See touch_observer.h.
#include "paratrain/data_parallel/fsdp/touch_observer.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

namespace paratrain::fsdp {
namespace {

struct ThreadListeners {
  at::CallbackHandle handle = 0;
  bool registered = false;
  bool busy = false;  // a listener is running: its own operations are not reported
  std::vector<std::weak_ptr<TouchListener>> listeners;
};

ThreadListeners& this_thread() {
  thread_local ThreadListeners listeners;
  return listeners;
}

// Note [Backward on the engine's device threads]
// A GPU backward runs on the autograd engine's worker thread for that GPU,
// not on the thread that called backward(). The engine carries the caller's
// thread-local state there (RecordFunction's callbacks included), so
// on_start does run for those operations, but on a thread whose own
// listener list is empty. Listeners registered with observe_engine_threads
// are told about operations on such threads. Only a process that trains
// one model on GPUs registers one (a GPU rank is a process), so there is
// no question whose backward it is.
// Never destroyed: threads may still run operations while statics are torn
// down at exit. The count lets threads without listeners skip the lock.
std::mutex& engine_mu() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::vector<std::weak_ptr<TouchListener>>& engine_listeners() {
  static auto* listeners = new std::vector<std::weak_ptr<TouchListener>>;
  return *listeners;
}
std::atomic<int> engine_listener_count{0};

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  ThreadListeners& t = this_thread();
  if (t.busy) return nullptr;
  if (t.listeners.empty()) {
    if (engine_listener_count.load(std::memory_order_relaxed) == 0) return nullptr;
    std::vector<std::shared_ptr<TouchListener>> live;
    {
      std::lock_guard<std::mutex> lock(engine_mu());
      auto& all = engine_listeners();
      for (const auto& weak : all)
        if (auto listener = weak.lock()) live.push_back(std::move(listener));
    }
    if (live.empty()) return nullptr;
    t.busy = true;
    for (const auto& listener : live) listener->on_operation(fn);
    t.busy = false;
    return nullptr;
  }
  t.busy = true;
  for (std::size_t i = 0; i < t.listeners.size();) {
    if (auto listener = t.listeners[i].lock()) {
      listener->on_operation(fn);
      ++i;
    } else {
      t.listeners.erase(t.listeners.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  t.busy = false;
  return nullptr;
}

}  // namespace

void observe_this_thread(const std::shared_ptr<TouchListener>& listener) {
  ThreadListeners& t = this_thread();
  for (const auto& existing : t.listeners) {
    if (!existing.owner_before(listener) && !listener.owner_before(existing)) return;
  }
  t.listeners.push_back(listener);
  if (!t.registered) {
    // Removed by release_idle_observer() once no listener is left; otherwise
    // it dies with the thread.
    t.handle = at::addThreadLocalCallback(at::RecordFunctionCallback(&on_start)
                                   .needsInputs(true)
                                   .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
    t.registered = true;
  }
}

void observe_engine_threads(const std::shared_ptr<TouchListener>& listener) {
  std::lock_guard<std::mutex> lock(engine_mu());
  auto& all = engine_listeners();
  all.erase(std::remove_if(all.begin(), all.end(), [](const auto& w) { return w.expired(); }), all.end());
  for (const auto& existing : all) {
    if (!existing.owner_before(listener) && !listener.owner_before(existing)) return;
  }
  all.push_back(listener);
  engine_listener_count.store(static_cast<int>(all.size()));
}

void release_idle_observer() {
  ThreadListeners& t = this_thread();
  if (t.busy || !t.registered) return;
  for (const auto& listener : t.listeners) {
    if (!listener.expired()) return;
  }
  t.listeners.clear();
  at::removeCallback(t.handle);
  t.registered = false;
}

}  // namespace paratrain::fsdp
