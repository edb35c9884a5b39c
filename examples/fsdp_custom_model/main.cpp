// ZeRO-3 (FSDP) around a user's own model: every rank holds 1/N of each
// parameter, gradient and Adam state; units are gathered just in time for
// forward and backward. ZeroDataParallel (ZeRO-1/2) is used the same way.
// paratrain-specific: 12 of 47 code lines (those naming paratrain, the wrapper or the
// world; blank and comment lines not counted); one per step: fsdp.step(opt).
#include <paratrain/paratrain.h>
#include <torch/torch.h>

#include <cstdio>
#include <string>

// A user's model: four children, each of which can become an FSDP unit.
struct DeepNetImpl : torch::nn::Module {
  DeepNetImpl() {
    for (int i = 0; i < 4; ++i) layers.push_back(register_module("fc" + std::to_string(i), torch::nn::Linear(32, 32)));
    head = register_module("head", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& layer : layers) x = torch::relu(layer(x));
    return head(x);
  }
  std::vector<torch::nn::Linear> layers;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(DeepNet);

int main() {
  auto world = paratrain::init_from_env();
  torch::manual_seed(0);
  auto x = torch::randn({512, 32});
  auto y = x.slice(1, 0, 4).argmax(1);  // a class label per row
  const int64_t batch = 64 / world.size();

  DeepNet net;
  // One unit per child (fc0..fc3, head): at most ~two units whole at a time.
  paratrain::FsdpOptions fsdp_options;
  fsdp_options.unit_min_params = 0;
  paratrain::FullyShardedDataParallel fsdp(net.ptr(), world.group(), fsdp_options);
  // The optimizer sees only this rank's shard pieces.
  torch::optim::Adam opt(fsdp.optimizer_params(), torch::optim::AdamOptions(3e-3));
  paratrain::DistributedSampler sampler(x.size(0), {.num_replicas = world.size(), .rank = world.rank(), .seed = 1});

  for (int64_t epoch = 0; epoch < 10; ++epoch) {
    sampler.set_epoch(epoch);
    const auto rows = sampler.indices();
    for (int64_t b = 0; b + batch <= rows.size(0); b += batch) {
      const auto idx = rows.slice(0, b, b + batch);
      auto loss = torch::cross_entropy_loss(net->forward(x.index_select(0, idx)), y.index_select(0, idx));
      opt.zero_grad();
      loss.backward();  // FSDP: gradients reduce-scattered into the shards during backward
      fsdp.step(opt);
      if (world.is_main() && b == 0) std::printf("epoch %lld loss %.4f\n", (long long)epoch, loss.item<double>());
    }
  }
  // Read weights through the wrapper (FSDP parameters are freed between steps).
  double sum = 0;
  for (const auto& [name, p] : fsdp.full_parameters()) sum += p.sum().item<double>();  // collective
  if (world.is_main()) std::printf("FSDP on %d ranks: params sum %.9g\n", world.size(), sum);
  // Each rank writes its own shards; any world size or wrapper loads them.
  paratrain::save_checkpoint("fsdp_ckpt", fsdp, &opt, 0);
  return 0;
}
