// `paratrain generate --checkpoint CKPT --prompt TEXT [--tokens N]
// [--temperature T] [--top-k K] [--seed S] [--config FILE]`: samples text
// from a trained GPT. Parsing only; loading and sampling live in
// paratrain/train/generate.h.
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include "apps/paratrain/commands.h"
#include "paratrain/train/generate.h"

namespace paratrain::cli {

Command add_generate_command(CLI::App& app) {
  struct Args {
    std::string checkpoint;
    std::string config;
    std::string prompt;
    train::SamplingOptions sampling;
  };
  auto args = std::make_shared<Args>();
  auto* sub = app.add_subcommand(
      "generate", "Sample text from a trained GPT checkpoint (model.kind = \"gpt\"), printing the prompt and what "
                  "follows it");
  sub->add_option("--checkpoint", args->checkpoint,
                  "checkpoint directory or .safetensors file, e.g. runs/gpt_fortunes/checkpoints/step_00000500")
      ->required();
  sub->add_option("--prompt", args->prompt, "text the sample continues (empty: start a new line)");
  sub->add_option("--tokens", args->sampling.tokens, "bytes to generate")->check(CLI::NonNegativeNumber)->capture_default_str();
  sub->add_option("--temperature", args->sampling.temperature, "softmax temperature (0 = always the likeliest byte)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--top-k", args->sampling.top_k, "draw among the k likeliest bytes (0 = all)")
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
  sub->add_option("--seed", args->sampling.seed, "sampling seed: the same seed gives the same text")->capture_default_str();
  sub->add_option("--config", args->config,
                  "the run's config.toml (default: the one in the run folder holding the checkpoint)");

  auto run = [args]() -> int {
    torch::set_num_threads(1);  // one sequence at a time: threads cost more than they help
    const auto config = train::config_for_checkpoint(args->checkpoint, args->config);
    const auto model = train::load_model_for_inference(config, args->checkpoint);
    std::fputs(args->prompt.c_str(), stdout);
    std::fflush(stdout);
    train::generate(*model, config.model.seq_len, args->prompt, args->sampling, [](char c) {
      std::fputc(c, stdout);
      std::fflush(stdout);
    });
    std::fputc('\n', stdout);
    return 0;
  };
  return {sub, run};
}

}  // namespace paratrain::cli
