#include "paratrain/data_parallel/ddp/compress_hook.h"

#include <numeric>
#include <vector>

#include "paratrain/comm/low_precision_all_reduce.h"
#include "paratrain/core/error.h"

namespace paratrain::ddp {

comm::ProcessGroup& FollowUpGroup::of(comm::ProcessGroup& group) {
  std::lock_guard lock(mu_);
  if (!group_) {
    std::vector<int> all(static_cast<std::size_t>(group.size()));
    std::iota(all.begin(), all.end(), 0);
    group_ = group.new_subgroup(all);
    parent_ = &group;
  } else if (parent_ != &group) {
    throw Error("a compression comm hook serves one process group; build one hook per DDP instance");
  }
  return *group_;
}

BucketCommHook low_precision_hook(at::ScalarType wire) {
  auto second = std::make_shared<FollowUpGroup>();
  return [wire, second](comm::ProcessGroup& group, std::size_t, at::Tensor& buffer) {
    return comm::all_reduce_low_precision(group, buffer, wire, &second->of(group));
  };
}

}  // namespace paratrain::ddp
