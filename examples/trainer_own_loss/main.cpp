// The Trainer on your own module and your own loss: a two-headed network
// (a regression value and a 3-way class) with a weighted multi-task loss.
// The module is a plain torch::nn::Module and the loss a small Task; the
// config's [user] table carries the program's own hyper-parameters.
// paratrain-specific: 15 of 72 code lines (those naming paratrain or the
// world, and the Task's overrides; blank and comment lines not counted); the
// rest is what a LibTorch program has anyway.
//
//   paratrain launch --nproc-per-node 2 -- ./trainer_own_loss multitask.toml zero.stage=2
#include <paratrain/paratrain.h>
#include <torch/torch.h>

#include <cstdio>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

// Any torch::nn::Module; nothing paratrain-specific in it. Its two heads go
// out side by side, [N, 1 + 3].
struct TwoHeadsImpl : torch::nn::Module {
  explicit TwoHeadsImpl(int64_t hidden)
      : trunk(register_module("trunk", torch::nn::Linear(8, hidden))),
        value(register_module("value", torch::nn::Linear(hidden, 1))),
        classes(register_module("classes", torch::nn::Linear(hidden, 3))) {}
  torch::Tensor forward(torch::Tensor x) {
    auto h = torch::relu(trunk(x));
    return torch::cat({value(h), classes(h)}, 1);
  }
  torch::nn::Linear trunk, value, classes;
};
TORCH_MODULE(TwoHeads);

// The loss and the evaluation metrics. Targets are [N, 2]: the value, then
// the class id.
class MultiTask : public paratrain::Task {
 public:
  explicit MultiTask(double class_weight) : w_(class_weight) {}
  torch::Tensor loss(const torch::Tensor& out, const torch::Tensor& y) const override {
    return F::mse_loss(out.select(1, 0), y.select(1, 0)) +
           w_ * F::cross_entropy(out.slice(1, 1), y.select(1, 1).to(torch::kLong));
  }
  // Sums over a chunk; the Trainer reduces them over ranks and logs each
  // divided by the count: test_loss, test_accuracy, test_value_mse.
  paratrain::EvalSums eval_sums(const torch::Tensor& out, const torch::Tensor& y) const override {
    const auto labels = y.select(1, 1).to(torch::kLong);
    const auto mse = (out.select(1, 0) - y.select(1, 0)).pow(2);
    const auto ce = F::cross_entropy(out.slice(1, 1), labels, F::CrossEntropyFuncOptions().reduction(torch::kNone));
    paratrain::EvalSums s;
    s.count = static_cast<double>(y.size(0));
    s.add("loss", (mse + w_ * ce).sum().item<double>());
    s.add("accuracy", out.slice(1, 1).argmax(1).eq(labels).sum().item<double>());
    s.add("value_mse", mse.sum().item<double>());
    return s;
  }

 private:
  double w_;
};

// 8 features; the value is a smooth function of them, the class which of
// three projections is largest. The same rows on every rank (fixed seed).
paratrain::TensorDataset make_rows(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto x = torch::randn({n, 8}, gen);
  auto value = torch::sin(x.select(1, 0)) + 0.5 * x.select(1, 1) * x.select(1, 2);
  auto label = x.slice(1, 3, 6).argmax(1).to(torch::kFloat);
  return {x, torch::stack({value, label}, 1)};
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CONFIG.toml [key=value ...]\n", argv[0]);
    return 2;
  }
  const auto config = paratrain::load_config(argv[1], std::vector<std::string>(argv + 2, argv + argc));
  paratrain::TrainerParts parts;
  parts.model = paratrain::any_module([](const paratrain::TrainConfig& c) { return TwoHeads(c.user.get<int64_t>("hidden")); });
  parts.task = std::make_shared<MultiTask>(config.user.get<double>("class_weight"));
  parts.data = [](const paratrain::TrainConfig& c) {
    return paratrain::Datasets{make_rows(8192, c.run.seed + 1), make_rows(2048, c.run.seed + 2)};
  };

  auto world = paratrain::init_from_env();
  paratrain::Trainer trainer(config, world.group(), parts);
  const auto result = trainer.fit();
  if (world.is_main()) {
    double value_mse = 0;
    for (const auto& [name, v] : result.test.metrics)
      if (name == "test_value_mse") value_mse = v;
    std::printf("%s: %lld steps, test value MSE %.4f, class accuracy %.2f%%, run dir %s\n",
                trainer.strategy_name().c_str(), (long long)result.steps, value_mse, 100 * result.test.accuracy,
                result.run_dir.c_str());
  }
  world.barrier();
  return 0;
}
