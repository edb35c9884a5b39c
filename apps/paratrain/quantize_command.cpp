// `paratrain quantize CHECKPOINT -o FILE [--bits N] [--per-tensor]
// [--calibrate N | --activations MODE] [--activation-bits N]` and
// `paratrain evaluate --checkpoint X`: int8 post-training quantization of a
// trained model's weights, and the test metrics of a float or int8
// checkpoint. Parsing only; the work lives in
// paratrain/train/inference/trained_model.h (docs/quantization.md).
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include "apps/paratrain/commands.h"
#include "paratrain/train/inference/trained_model.h"

namespace paratrain::cli {

Command add_quantize_command(CLI::App& app) {
  struct Args {
    std::string checkpoint;
    std::string out;
    int bits = 0;
    bool per_tensor = false;
    int64_t calibrate = 0;
    std::string activations;
    int activation_bits = 0;
  };
  auto args = std::make_shared<Args>();
  auto* sub = app.add_subcommand("quantize",
                                 "Post-training quantization: a checkpoint's Linear and Conv weights to int8 with "
                                 "float scales per output channel, in one safetensors file (docs/quantization.md)");
  sub->add_option("checkpoint", args->checkpoint, "checkpoint folder or consolidated .safetensors file")->required();
  sub->add_option("-o,--output", args->out, "the int8 file to write, e.g. model.int8.safetensors")->required();
  sub->add_option("--bits", args->bits,
                  "bits per weight, 2 to 8 (stored as int8); default: the run's quant.weight_bits when it trained "
                  "with quant.qat, else 8")
      ->check(CLI::Range(2, 8));
  sub->add_flag("--per-tensor", args->per_tensor, "one scale per weight tensor instead of one per output channel");
  sub->add_option("--calibrate", args->calibrate,
                  "static int8 activation ranges from the first N batches of the training split (data.batch_size "
                  "each)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  sub->add_option("--activations", args->activations,
                  "none (float activations), dynamic (each input's own range at run time) or static (with "
                  "--calibrate); default: dynamic, static with --calibrate, a QAT run's own")
      ->check(CLI::IsMember({"none", "dynamic", "static"}));
  sub->add_option("--activation-bits", args->activation_bits,
                  "bits of the quantized activations, 2 to 8; default 8, or a QAT run's quant.activation_bits")
      ->check(CLI::Range(2, 8));
  auto run = [args]() -> int {
    torch::set_num_threads(1);
    train::QuantizeOptions options;
    options.bits = args->bits;
    options.granularity = args->per_tensor ? quant::Granularity::kPerTensor : quant::Granularity::kPerChannel;
    options.calibrate = args->calibrate;
    options.activations = args->activations;
    options.activation_bits = args->activation_bits;
    const auto report = train::quantize_checkpoint(args->checkpoint, args->out, options);
    std::string activations = "float activations";
    if (report.activations == "dynamic") activations = fmt::format("int{} activations, dynamic", report.activation_bits);
    if (report.activations == "static")
      activations = report.calibrated_batches > 0
                        ? fmt::format("int{} activations, static from {} calibration batches", report.activation_bits,
                                      report.calibrated_batches)
                        : fmt::format("int{} activations, static on the run's learned ranges", report.activation_bits);
    std::printf("wrote %s: %zu weights to %d bits (%s), %s, %.1f KiB of parameters and buffers -> %.1f KiB (%.2fx "
                "smaller)\n",
                args->out.c_str(), report.quantized.size(), report.bits,
                args->per_tensor ? "per tensor" : "per output channel", activations.c_str(),
                report.float_bytes / 1024.0, report.file_bytes / 1024.0,
                report.file_bytes > 0 ? static_cast<double>(report.float_bytes) / report.file_bytes : 0.0);
    return 0;
  };
  return {sub, run};
}

Command add_evaluate_command(CLI::App& app) {
  struct Args {
    std::string checkpoint;
    bool simulate = false;
  };
  auto args = std::make_shared<Args>();
  auto* sub = app.add_subcommand("evaluate",
                                 "Test loss and accuracy (perplexity for the GPT) of a checkpoint, float (any "
                                 "layout) or int8 (paratrain quantize), on its run's test split");
  sub->add_option("--checkpoint", args->checkpoint, "checkpoint folder, consolidated file or int8 file")->required();
  sub->add_flag("--simulate", args->simulate,
                "run an int8 file with dynamic activations simulated in float32 instead of on LibTorch's int8 "
                "Linear kernels");
  auto run = [args]() -> int {
    torch::set_num_threads(1);
    train::LoadOptions options;
    options.int8_kernels = !args->simulate;
    const auto* checkpoint = &args->checkpoint;
    const auto trained = train::load_trained_model(*checkpoint, options);
    const auto r = train::evaluate_trained_model(trained);
    const std::string activations =
        trained.activations == "none" ? "float32"
                                      : fmt::format("int{} {}", trained.activation_bits, trained.activations);
    std::printf("%s (%s, %s weights, %s activations, %s, step %lld): test loss %.4f, %s (%lld %s)\n",
                checkpoint->c_str(), trained.config.model.kind.c_str(),
                trained.quantized ? fmt::format("int{}", trained.bits).c_str() : "float32", activations.c_str(),
                trained.kernels.c_str(),
                static_cast<long long>(trained.step), r.loss,
                r.perplexity > 0 ? fmt::format("perplexity {:.3f}", r.perplexity).c_str()
                                 : fmt::format("accuracy {:.2f}%", 100.0 * r.accuracy).c_str(),
                static_cast<long long>(r.count), r.perplexity > 0 ? "tokens" : "items");
    return 0;
  };
  return {sub, run};
}

}  // namespace paratrain::cli
