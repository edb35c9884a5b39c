// TwoHeadNet and its training loops: see two_head_net.h.
#include "tests/ddp/two_head_net.h"

#include <torch/torch.h>


#include "tests/support/multi_rank.h"
#include "tests/support/seeded.h"

namespace paratrain::ddp::testing {

TwoHeadNetImpl::TwoHeadNetImpl() {
  body = register_module("body", torch::nn::Linear(64, 16));
  extra = register_module("extra", torch::nn::Linear(16, 16));
  head = register_module("head", torch::nn::Linear(16, 10));
  stat = register_buffer("stat", torch::zeros({1}));
}

at::Tensor TwoHeadNetImpl::forward(const at::Tensor& x, bool use_extra) {
  {
    torch::NoGradGuard no_grad;
    stat.add_(x.mean());
  }
  auto h = torch::relu(body(x.reshape({x.size(0), -1})));
  if (use_extra) h = h + extra(h);
  return head(h);
}

TwoHeadNet make_two_head(uint64_t seed) {
  return paratrain::testing::seeded(seed, [] { return TwoHeadNet(); });
}

at::Tensor loss_of(TwoHeadNet& net, const Problem& p, int step, int rank, int world, bool use_extra) {
  return torch::nn::functional::cross_entropy(net->forward(shard(p.batch_inputs(step), rank, world), use_extra),
                                              shard(p.batch_targets(step), rank, world));
}

std::vector<Snapshot> train_two_head(int world, const DdpOptions& options, const Problem& p, uint64_t seed,
                                     const std::function<bool(int)>& use_extra) {
  std::vector<Snapshot> out(world);
  paratrain::testing::run_ranks(world, [&](comm::ProcessGroup& group) {
    TwoHeadNet net = make_two_head(seed + group.rank());
    DistributedDataParallel ddp(net.ptr(), group, options);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    for (int step = 0; step < p.steps; ++step) {
      ddp.prepare_forward();
      auto loss = loss_of(net, p, step, group.rank(), world, use_extra(group.rank()));
      opt.zero_grad();
      loss.backward();
      opt.step();
    }
    out[group.rank()] = snapshot(*net);
  });
  return out;
}

Snapshot two_head_oracle(int world, const Problem& p, uint64_t seed, const std::function<bool(int)>& use_extra) {
  TwoHeadNet net = make_two_head(seed);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 0; step < p.steps; ++step) {
    at::Tensor total = torch::zeros({});
    for (int r = 0; r < world; ++r) total = total + loss_of(net, p, step, r, world, use_extra(r));
    opt.zero_grad();
    (total / world).backward();
    opt.step();
  }
  return snapshot(*net);
}

}  // namespace paratrain::ddp::testing
