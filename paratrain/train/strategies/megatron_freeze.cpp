// Freezing in the megatron strategy: see megatron_freeze.h.
#include "paratrain/train/strategies/megatron_freeze.h"

#include <torch/torch.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "paratrain/core/error.h"

namespace paratrain::train::strategies {

// Note [Freezing in the megatron strategy]
// freeze.modules marks the full model's parameters (requires_grad false)
// before the strategy splits it; the tp shards are the split model's own
// parameters, so the marks are carried over by name. After that every
// part plans around them as the other strategies do: DDP's buckets and
// ZeRO's shards over the replicas hold trainable tensors only, the
// optimizer gets none of them, clipping skips gradients that do not
// exist, the Megatron-SP and tied-weight sums leave frozen tensors out,
// and a prefix of pipeline chunks that trains nothing runs no backward
// (the executor's frozen_chunks). A chunk with nothing to train is still
// wrapped for the replicas (an empty bucket plan: no traffic).
std::set<std::string> frozen_names(torch::nn::Module& full) {
  std::set<std::string> out;
  for (const auto& item : full.named_parameters())
    if (!item.value().requires_grad()) out.insert(item.key());
  return out;
}

void keep_frozen(torch::nn::Module& split, const std::set<std::string>& frozen) {
  std::set<std::string> missing = frozen;
  for (auto& item : split.named_parameters()) {
    if (!frozen.count(item.key())) continue;
    item.value().set_requires_grad(false);
    missing.erase(item.key());
  }
  if (!missing.empty())
    throw Error(fmt::format("megatron strategy: the frozen parameters [{}] have no counterpart in the split model "
                            "(its parameters are named as the whole model's); this is a bug",
                            fmt::join(missing, ", ")));
}

// Megatron-SP sums the gradients of these over tp: a frozen one has none.
std::vector<at::Tensor> trainable(std::vector<at::Tensor> params) {
  std::erase_if(params, [](const at::Tensor& t) { return !t.requires_grad(); });
  return params;
}

}  // namespace paratrain::train::strategies
