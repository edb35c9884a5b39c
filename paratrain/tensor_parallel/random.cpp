// Per-rank dropout streams inside tensor-parallel regions. See random.h.
#include "paratrain/tensor_parallel/random.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

namespace paratrain::tensor_parallel {

uint64_t region_seed(uint64_t base_seed, int tp_rank) {
  return base_seed + kRegionSeedOffset + static_cast<uint64_t>(tp_rank);
}

at::Generator make_region_generator(uint64_t base_seed, int tp_rank) {
  return at::make_generator<at::CPUGeneratorImpl>(region_seed(base_seed, tp_rank));
}

at::Tensor dropout_with(const at::Tensor& x, double p, bool training, at::Generator& generator) {
  TORCH_CHECK(p >= 0 && p < 1, "dropout probability must be in [0, 1), got ", p);
  if (!training || p == 0) return x;
  at::Tensor mask = at::empty_like(x, at::MemoryFormat::Contiguous);
  // bernoulli_ takes the generator's lock itself (Note [Acquire lock when
  // using random generators]); locking here too would deadlock.
  mask.bernoulli_(1 - p, generator);
  return x * mask / (1 - p);
}

}  // namespace paratrain::tensor_parallel
