// The registry of attached.h: address -> (weak module, state).
#include "paratrain/tensor_parallel/attached.h"

#include <mutex>
#include <shared_mutex>
#include <unordered_map>

namespace paratrain::tensor_parallel {
namespace {

struct Entry {
  std::weak_ptr<const torch::nn::Module> module;
  std::shared_ptr<AttachedState> state;
};

struct Registry {
  std::shared_mutex mutex;
  std::unordered_map<const torch::nn::Module*, Entry> entries;
  size_t swept_size = 0;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void attach_state(const torch::nn::Module& module, std::shared_ptr<AttachedState> state) {
  // shared_from_this throws for a module not owned by a shared_ptr (LibTorch
  // names the problem): a plan needs modules of a tree.
  std::weak_ptr<const torch::nn::Module> weak = module.shared_from_this();
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  // Entries of modules that are gone are dropped here, not on lookup, and
  // only when the map has doubled since the last sweep (planning a model of
  // N modules stays O(N)).
  if (r.entries.size() >= 2 * r.swept_size + 64) {
    std::erase_if(r.entries, [](const auto& item) { return item.second.module.expired(); });
    r.swept_size = r.entries.size();
  }
  r.entries[&module] = Entry{std::move(weak), std::move(state)};
}

std::shared_ptr<AttachedState> attached_state(const torch::nn::Module& module) {
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  auto it = r.entries.find(&module);
  if (it == r.entries.end()) return nullptr;
  const auto alive = it->second.module.lock();
  return alive.get() == &module ? it->second.state : nullptr;
}

}  // namespace paratrain::tensor_parallel
