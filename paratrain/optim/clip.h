// Gradient-norm clipping that leaves the norm on the gradients' device.
//
// Note [Clipping without a sync]
// LibTorch C++'s torch::nn::utils::clip_grad_norm_ returns the total norm as
// a double: reading it waits for the device to finish the whole backward,
// and the optimizer's kernels can only be launched after that, with the GPU
// idle meanwhile (the fp32 GPT's profile on an H200, against PyTorch's
// Python clip_grad_norm_, which returns a tensor: bench/results/
// 2026-11-27-cuda-h200-run2.md). These functions do the same arithmetic,
// operation for operation (so the same bits on the CPU), but keep the norm
// and the coefficient min(1, max_norm / (norm + 1e-6)) as tensors, and
// scale device gradients by the tensor coefficient; nothing reads a device
// value. CPU gradients are scaled only when the coefficient is below 1
// (reading a CPU tensor costs no sync, and skipping saves a pass over them);
// multiplying by exactly 1 would leave the same values.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace paratrain::optim {

/// Scales the gradients of `params` (those that have one) so that their total
/// 2-norm is at most `max_norm`, as torch::nn::utils::clip_grad_norm_ does,
/// and returns that norm before clipping as a 0-dim tensor on the gradients'
/// device: no device-to-host sync (Note [Clipping without a sync]). An
/// undefined tensor when no parameter has a gradient.
at::Tensor clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm);

/// min(1, max_norm / (norm + 1e-6)): the clipping coefficient of
/// torch::nn::utils::clip_grad_norm_ for a total norm `norm` (a tensor), in
/// its operations and dtype.
at::Tensor clip_coefficient(const at::Tensor& norm, double max_norm);

/// Multiplies every defined tensor of `grads` by `coef` (a 0-dim tensor, as
/// clip_coefficient() returns): on devices always, with the coefficient on
/// that device; on the CPU only when it is below 1.
void scale_by_coefficient(const std::vector<at::Tensor>& grads, const at::Tensor& coef);

}  // namespace paratrain::optim
