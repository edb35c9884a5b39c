// Any torch::nn::Module as the model the Trainer trains: no base class, no
// registration. A program hands TrainerParts::model (trainer.h) a builder of
// its own module, wrapped by any_module():
//
//   parts.model = paratrain::any_module([](const paratrain::TrainConfig& c) {
//     return std::make_shared<MyNetImpl>(c.user.get<int64_t>("hidden"));
//   });
//
// The module needs a forward(at::Tensor) returning an at::Tensor (a model
// with several heads returns them side by side, e.g. torch::cat along dim
// 1, and its Task splits them). Every strategy that trains a whole model
// applies: DDP, ZeRO-1/2/3, FSDP, parameter servers, local SGD, with
// accumulation, precision, schedules, checkpoints and resume. A
// torch::nn::Sequential is also cut at its children into pipeline stages
// (parallel.pp; a weight two children share is a child one of them
// registers from the other, pipeline/tied.h); tensor parallelism splits it
// by parallel.tp_plan when its forward runs the planned layers at their
// sites (parallelize/plan.h); context parallelism refuses it.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>

#include "paratrain/models/model.h"

namespace paratrain::train {

struct TrainConfig;

/// Builds the model the Trainer trains (models::Model): what any_module()
/// returns, or a builder of a paratrain model.
using ModelBuilder = std::function<std::shared_ptr<models::Model>(const TrainConfig&)>;

/// Note [Adopting a module]
/// The user's module is adopted, not wrapped: its direct parameters, buffers
/// and children are registered on the adapter under their own names, so
/// named_parameters() — and with it every checkpoint, consolidated file and
/// `checkpoint compare` — reads exactly as the user's module would
/// ("fc1.weight", not "module.fc1.weight"). The tensors and submodules are
/// the same objects, so what a strategy does to them in place (DDP's hooks,
/// ZeRO-3's set_data, .to(device)) the user's forward sees. train()/eval()
/// reach the user's module itself too, for a forward that reads
/// is_training().
template <typename M>
class AdoptedModule final : public models::Model {
 public:
  /// Registers `inner`'s direct parameters, buffers and children as its own.
  explicit AdoptedModule(std::shared_ptr<M> inner) : Model(inner->name()), inner_(std::move(inner)) {
    for (const auto& p : inner_->named_parameters(/*recurse=*/false))
      register_parameter(p.key(), p.value(), p.value().requires_grad());
    for (const auto& b : inner_->named_buffers(/*recurse=*/false)) register_buffer(b.key(), b.value());
    for (const auto& child : inner_->named_children()) register_module(child.key(), child.value());
  }
  /// The user's forward.
  at::Tensor forward(const at::Tensor& x) override { return inner_->forward(x); }
  /// Training or evaluation mode, on the adopted children and the user's module.
  void train(bool on = true) override {
    torch::nn::Module::train(on);
    inner_->train(on);
  }
  /// The user's module, as built.
  const std::shared_ptr<M>& inner() const { return inner_; }

  /// A torch::nn::Sequential is a pipeline's list of layers: one per child,
  /// named as its parameters are ("0", "1", ...), each running the child's
  /// forward (each child must take and return one tensor). Each layer holds
  /// only its own child, so a stage keeps only its layers. Any other module
  /// cannot be cut (empty).
  std::vector<models::Layer> layers() override {
    std::vector<models::Layer> out;
    if constexpr (std::is_same_v<M, torch::nn::SequentialImpl>) {
      const auto children = inner_->named_children();
      if (children.size() != inner_->size()) return out;  // not the plain list of children it should be
      for (size_t i = 0; i < children.size(); ++i) {
        const std::string name = children[i].key();
        // A copy of the AnyModule shares the child; the lambda holds no other.
        torch::nn::AnyModule child = *(inner_->begin() + static_cast<std::ptrdiff_t>(i));
        out.push_back({.name = name,
                       .modules = {{name, children[i].value()}},
                       .forward = [child](const at::Tensor& x) mutable {
                         at::Tensor in = x;
                         return child.forward<at::Tensor>(in);
                       }});
      }
    }
    return out;
  }

 private:
  std::shared_ptr<M> inner_;
};

/// A ModelBuilder from a builder of any module M (a std::shared_ptr<M> or a
/// torch::nn::ModuleHolder such as torch::nn::Sequential). Called once per
/// rank under the run's seed, like the built-in models.
template <typename Build>
ModelBuilder any_module(Build build) {
  return [build = std::move(build)](const TrainConfig& config) -> std::shared_ptr<models::Model> {
    auto built = build(config);
    if constexpr (requires { built.ptr(); }) {
      using M = typename decltype(built)::ContainedType;
      return std::make_shared<AdoptedModule<M>>(built.ptr());
    } else {
      using M = typename decltype(built)::element_type;
      static_assert(std::is_base_of_v<torch::nn::Module, M>, "any_module: the builder must return a torch::nn::Module");
      static_assert(std::is_convertible_v<decltype(std::declval<M&>().forward(std::declval<at::Tensor>())), at::Tensor>,
                    "any_module: the module needs a forward(at::Tensor) that returns an at::Tensor");
      if (!built) return nullptr;
      return std::make_shared<AdoptedModule<M>>(std::move(built));
    }
  };
}

}  // namespace paratrain::train
