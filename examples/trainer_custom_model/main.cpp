// The Trainer with a user's own model and dataset: register them under a
// name, then a TOML config names them (model.kind, data.dataset) and every
// other key (zero.stage, optimizer, lr schedule, checkpoints, resume) works
// as for the built-in models; with layers() it is cut into pipeline stages
// too (parallel.pp = 2). Usage: trainer_custom_model CONFIG [key=value...]
// paratrain-specific: 14 of 54 code lines (those naming paratrain or the world, and
// the model's override; blank and comment lines not counted).
#include <paratrain/paratrain.h>
#include <torch/torch.h>

#include <cstdio>
#include <string>
#include <vector>

// Models the Trainer trains derive from paratrain::Model: forward(x) -> logits.
class SpiralNet : public paratrain::Model {
 public:
  explicit SpiralNet(int64_t hidden) : Model("spiral_net") {
    fc1_ = register_module("fc1", torch::nn::Linear(2, hidden));
    fc2_ = register_module("fc2", torch::nn::Linear(hidden, hidden));
    out_ = register_module("out", torch::nn::Linear(hidden, 3));
  }
  at::Tensor forward(const at::Tensor& x) override { return out_(torch::tanh(fc2_(torch::tanh(fc1_(x))))); }
  // Optional: the same forward as a list of layers, so parallel.pp can cut
  // the model into pipeline stages (each layer names the modules it owns).
  std::vector<paratrain::Layer> layers() override {
    auto layer = [](std::string name, torch::nn::Linear m, bool tanh) {
      return paratrain::Layer{.name = name, .modules = {{name, m.ptr()}}, .forward = [m, tanh](const at::Tensor& x) mutable {
                                auto y = m->forward(x);
                                return tanh ? torch::tanh(y) : y;
                              }};
    };
    return {layer("fc1", fc1_, true), layer("fc2", fc2_, true), layer("out", out_, false)};
  }

 private:
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr}, out_{nullptr};
};

// Three interleaved spirals, 2-D points; targets are int64 class labels.
paratrain::TensorDataset spirals(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto label = torch::randint(3, {n}, gen, torch::kLong);
  auto r = torch::rand({n}, gen);
  auto angle = 4 * r + label.to(torch::kFloat) * (2 * M_PI / 3) + 0.2 * torch::randn({n}, gen);
  return {torch::stack({r * torch::cos(angle), r * torch::sin(angle)}, 1), label};
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CONFIG.toml [key=value ...]\n", argv[0]);
    return 2;
  }
  // Register before reading the config: model.kind = "spiral_net" must be known then.
  paratrain::register_model("spiral_net", [](const paratrain::TrainConfig& c) {
    return std::make_shared<SpiralNet>(c.model.hidden.at(0));
  });
  paratrain::register_dataset("spirals", [](const paratrain::TrainConfig& c) {
    const auto seed = static_cast<uint64_t>(c.run.seed);
    return paratrain::Datasets{spirals(6000, seed + 1), spirals(1200, seed + 2)};  // same rows on every rank
  });

  auto config = paratrain::load_config(argv[1], std::vector<std::string>(argv + 2, argv + argc));
  auto world = paratrain::init_from_env();
  paratrain::Trainer trainer(config, world.group());
  const auto result = trainer.fit();
  if (world.is_main())
    std::printf("%s: %lld steps, test accuracy %.2f%%, run dir %s\n", trainer.strategy_name().c_str(),
                (long long)result.steps, 100 * result.test.accuracy, result.run_dir.c_str());
  world.barrier();
  return 0;
}
