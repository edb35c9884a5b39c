// observe_this_thread: one RecordFunction thread-local callback per thread,
// fanned out to that thread's live listeners. See touch_observer.h.
#include "paratrain/data_parallel/fsdp/touch_observer.h"

#include <ATen/record_function.h>

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

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  ThreadListeners& t = this_thread();
  if (t.busy || t.listeners.empty()) return nullptr;
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
