// alias_of(): a tensor over part of another tensor's storage that autograd
// does not treat as a view, so it can be a leaf the optimizer owns or serve as
// a parameter's .grad. Used for gradient-bucket slots (ddp/bucket.h) and ZeRO's
// shard pieces. Not a general view: no strides other than contiguous.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace paratrain {

// A contiguous tensor of `shape` over `base`'s storage starting `offset`
// elements past `base`'s own storage offset; writes through either are seen
// by both. Made with Tensor::set_() rather than narrow()/view(): autograd
// tracks those as views, views cannot be leaves requiring grad, and LibTorch
// 1.13's Optimizer::zero_grad() calls detach_() on every .grad, which throws
// for views. See Note [Gradients as bucket views] in docs/notes/ddp.md.
// The alias keeps the storage alive, has its own version counter and
// requires no grad. TORCH_CHECKs that the range lies inside the storage.
at::Tensor alias_of(const at::Tensor& base, int64_t offset, at::IntArrayRef shape);

}  // namespace paratrain
