// Skeleton models: built layer by layer with each layer's parameters given
// up as soon as the layer exists, for a model whose weights come from
// elsewhere (a checkpoint) and which one rank could not hold whole.
//
// Note [Skeleton models]
// LibTorch's modules allocate and initialise their parameters when they are
// constructed, and LibTorch 1.13 has no meta-device construction a module
// could later be materialised from (set_data refuses to turn a CPU
// parameter into a meta one). So the built-in models call skeletonize() on
// each layer right after constructing it: under a SkeletonScope the layer's
// parameters keep their TensorImpl (leaf, requires_grad, sizes) but their
// data becomes one element broadcast to their shape (stride 0), and the
// layer's own memory is freed before the next layer is made. Building a
// model so costs one layer's memory, not the model's. The values are
// meaningless (one zero); the model's own initialisation is skipped. FSDP
// built over such a model with FsdpOptions::skeleton lays out and shards
// the units without reading them (fsdp.h), and the caller then writes each
// rank's pieces, e.g. from a checkpoint (train/distill/teacher.cpp). Not
// reached: a program's own model, which is built whole.
#pragma once

#include <c10/core/Device.h>
#include <torch/nn/module.h>

namespace paratrain::models {

/// While alive, on this thread, skeletonize() gives up layers' parameters,
/// placing their placeholders on `device`. Nests (the innermost wins).
class SkeletonScope {
 public:
  explicit SkeletonScope(c10::Device device);
  ~SkeletonScope();
  SkeletonScope(const SkeletonScope&) = delete;
  SkeletonScope& operator=(const SkeletonScope&) = delete;

 private:
  bool was_active_;
  c10::Device was_device_;
};

/// Whether a SkeletonScope is alive on this thread.
bool building_skeleton();

/// Under a SkeletonScope: every parameter of `layer` (recursively) becomes a
/// placeholder of its shape (one zero broadcast, stride 0) on the scope's
/// device. Otherwise nothing.
void skeletonize(torch::nn::Module& layer);

/// Whether `t` is such a placeholder (every stride 0, one element of storage).
bool is_placeholder(const at::Tensor& t);

}  // namespace paratrain::models
