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
      field("quant.start_step", &TC::quant, &QuantConfig::start_step, "optimizer steps trained in float before fake quantization starts", in_range<int64_t>(0, int64_t{1} << 40)),
  };
}

std::string quant_problem(const TrainConfig& c) {
  if (!c.quant.qat) return "";
  if (c.parallel.pp > 1 || c.parallel.tp > 1 || c.parallel.cp > 1)
    return fmt::format("quant.qat with parallel.pp = {}, tp = {}, cp = {}: quantization-aware training wraps the "
                       "whole model, which pipelines and tensor/context parallelism cut; use data parallelism, "
                       "ZeRO/FSDP or parameter servers, or set quant.qat = false",
                       c.parallel.pp, c.parallel.tp, c.parallel.cp);
  return "";
}

}  // namespace paratrain::train::detail
