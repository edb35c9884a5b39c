// A user's own model and training loop, data-parallel with paratrain's DDP.
// The same binary runs alone or as N ranks (paratrain launch, torchrun):
// with global batch G every rank trains on G/N rows per step.
// paratrain-specific: 9 of 43 code lines (those naming paratrain, the wrapper or the
// world; blank and comment lines not counted); one per step: ddp.step(opt).
#include <paratrain/paratrain.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>

// Any torch::nn::Module works; nothing paratrain-specific in it.
struct NetImpl : torch::nn::Module {
  NetImpl() : fc1(register_module("fc1", torch::nn::Linear(16, 64))),
              fc2(register_module("fc2", torch::nn::Linear(64, 1))) {}
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

int main(int argc, char** argv) {
  auto world = paratrain::init_from_env();
  const int64_t global_batch = argc > 1 ? std::atoll(argv[1]) : 64, epochs = 3;
  const int64_t batch = global_batch / world.size();  // rows per rank per step
  torch::manual_seed(0);  // the same dataset (and initial model) on every rank
  auto x = torch::randn({1024, 16});
  auto y = torch::sin(x.narrow(1, 0, 4).sum(1, true)) + 0.1 * torch::randn({1024, 1});

  Net net;
  paratrain::DistributedDataParallel ddp(net.ptr(), world.group());  // rank 0's weights everywhere
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  // Rank r gets rows r, r+N, r+2N, ... of each epoch's permutation.
  paratrain::DistributedSampler sampler(x.size(0), {.num_replicas = world.size(), .rank = world.rank(), .seed = 1});

  int64_t step = 0;
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    sampler.set_epoch(epoch);
    const auto rows = sampler.indices();
    double loss_sum = 0;
    for (int64_t b = 0; b + batch <= rows.size(0); b += batch, ++step) {
      const auto idx = rows.slice(0, b, b + batch);
      auto loss = torch::mse_loss(net->forward(x.index_select(0, idx)), y.index_select(0, idx));
      opt.zero_grad();
      loss.backward();        // returns with gradients averaged over the ranks
      ddp.step(opt);          // as ZeRO's and FSDP's step(opt); joins peers if no gradient reached this rank,
                              // then prepares the next forward: the only per-step paratrain call
      loss_sum += loss.item<double>();
    }
    if (world.is_main()) std::printf("epoch %lld: mean loss of rank 0's batches %.5f\n", (long long)epoch, loss_sum / (rows.size(0) / batch));
  }
  double sum = 0, sumsq = 0;  // identical on every rank: replicas stay in sync
  for (const auto& p : net->parameters()) sum += p.sum().item<double>(), sumsq += p.square().sum().item<double>();
  std::printf("rank %d/%d: %lld steps, params sum %.9g, sum of squares %.9g\n", world.rank(), world.size(), (long long)step, sum, sumsq);
  // Sharded checkpoint (rank 0 writes the replicated tensors): `paratrain checkpoint inspect|compare` read it.
  paratrain::save_checkpoint(argc > 2 ? argv[2] : "ddp_custom_model_ckpt", ddp, &opt, step);
  return 0;
}
