// Local training of one client: see client.h.
#include "paratrain/federated/client.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>

#include "paratrain/models/model.h"

namespace paratrain::federated {

at::Tensor flatten_parameters(models::Model& model) {
  torch::NoGradGuard no_grad;
  return torch::nn::utils::parameters_to_vector(model.parameters()).clone();
}

void load_flat_parameters(models::Model& model, const at::Tensor& flat) {
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (auto& p : model.parameters()) {
    const int64_t n = p.numel();
    p.copy_(flat.slice(0, offset, offset + n).view_as(p));
    offset += n;
  }
  TORCH_CHECK(offset == flat.numel(), "load_flat_parameters: ", flat.numel(), " values for ", offset, " parameters");
}

ClientUpdate train_client(models::Model& model, const at::Tensor& global, const data::TensorDataset& data,
                          torch::optim::Optimizer& optimizer, const LocalTrainingOptions& options) {
  load_flat_parameters(model, global);
  model.train();
  auto params = model.parameters();
  // The global weights per parameter, for FedProx's gradient term.
  std::vector<at::Tensor> anchor;
  if (options.prox_mu > 0) {
    int64_t offset = 0;
    for (auto& p : params) {
      anchor.push_back(global.slice(0, offset, offset + p.numel()).view_as(p));
      offset += p.numel();
    }
  }

  const int64_t rows = data.size();
  const int64_t batch = std::clamp<int64_t>(options.batch_size, 1, std::max<int64_t>(rows, 1));
  const int64_t batches_per_pass = (rows + batch - 1) / batch;
  const int64_t total = options.steps > 0 ? options.steps : options.epochs * batches_per_pass;
  // The client's own generator: nothing here draws from torch's global RNG,
  // so clients on different threads or ranks never perturb each other.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(options.seed);

  ClientUpdate out;
  out.samples = rows;
  double loss_sum = 0;
  at::Tensor order;
  for (int64_t step = 0; step < total && rows > 0; ++step) {
    const int64_t in_pass = step % batches_per_pass;
    if (in_pass == 0) order = at::randperm(rows, gen, at::kLong);
    const auto idx = order.slice(0, in_pass * batch, std::min(rows, (in_pass + 1) * batch));
    const auto inputs = data.inputs.index_select(0, idx);
    const auto targets = data.targets.index_select(0, idx);
    optimizer.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model.forward(inputs), targets);
    loss.backward();
    if (options.prox_mu > 0) {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i)
        params[i].mutable_grad().add_(params[i].detach() - anchor[i], options.prox_mu);
    }
    if (options.clip_grad_norm > 0) torch::nn::utils::clip_grad_norm_(params, options.clip_grad_norm);
    optimizer.step();
    loss_sum += loss.item<double>();
    ++out.steps;
  }
  out.loss = out.steps > 0 ? loss_sum / static_cast<double>(out.steps) : 0.0;
  out.delta = flatten_parameters(model) - global;
  return out;
}

}  // namespace paratrain::federated
