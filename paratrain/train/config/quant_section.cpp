// The schema rows and cross-key rules of [quant] (quant_section.h).
#include "paratrain/train/config/quant_section.h"

#include <fmt/format.h>

#include "paratrain/train/config/config_ranges.h"
#include "paratrain/train/config/config_schema.h"

namespace paratrain::train::detail {

std::vector<FieldSpec> quant_fields() {
  using TC = TrainConfig;
  return {
      field("quant.qat", &TC::quant, &QuantConfig::qat, "quantization-aware training: every Linear and Conv2d weight fake-quantized in the forward (per output channel), gradients passed straight through"),
      field("quant.weight_bits", &TC::quant, &QuantConfig::weight_bits, "bits of the fake-quantized weights (paratrain quantize of the run uses them)", in_range<int64_t>(2, 8)),
      field("quant.activation_bits", &TC::quant, &QuantConfig::activation_bits, "bits of the fake-quantized inputs of every Linear and Conv2d (per tensor, on ranges learned as running averages over the global batches; paratrain quantize of the run uses them); 0 keeps activations float", Check<int64_t>([](const int64_t& v) -> std::string { return v == 0 || (v >= 2 && v <= 8) ? "" : "must be 0 (float activations) or 2 to 8"; })),
      field("quant.start_step", &TC::quant, &QuantConfig::start_step, "optimizer steps trained in float before fake quantization starts", in_range<int64_t>(0, int64_t{1} << 40)),
  };
}

std::string quant_problem(const TrainConfig& c) {
  if (!c.quant.qat) {
    if (c.quant.activation_bits != 0)
      return fmt::format("quant.activation_bits = {} fake-quantizes activations during quantization-aware training: "
                         "set quant.qat = true, or quant.activation_bits = 0 (paratrain quantize quantizes the "
                         "activations of a float run by itself)",
                         c.quant.activation_bits);
    return "";
  }
  if (c.quant.activation_bits != 0 && c.ps.servers > 0)
    return fmt::format("quant.activation_bits with parameter servers (ps.servers = {}): the learned activation "
                       "ranges are agreed by the workers' all-reduce, which servers do not join; use data "
                       "parallelism or ZeRO/FSDP, or set quant.activation_bits = 0",
                       c.ps.servers);
  if (c.parallel.pp > 1 || c.parallel.tp > 1 || c.parallel.cp > 1)
    return fmt::format("quant.qat with parallel.pp = {}, tp = {}, cp = {}: quantization-aware training wraps the "
                       "whole model, which pipelines and tensor/context parallelism cut; use data parallelism, "
                       "ZeRO/FSDP or parameter servers, or set quant.qat = false",
                       c.parallel.pp, c.parallel.tp, c.parallel.cp);
  return "";
}

}  // namespace paratrain::train::detail
