// [quant]: quantization-aware training (docs/quantization.md). The section of
// TrainConfig (config.h); its schema rows and rules are in quant_section.cpp.
#pragma once

#include <cstdint>

namespace paratrain::train {

/// `[quant]`: fake quantization of every Linear and Conv2d weight in the
/// forward (per output channel, symmetric), gradients passed straight
/// through, so the model learns weights that survive `paratrain quantize`.
struct QuantConfig {
  bool qat = false;           ///< quantization-aware training on
  int64_t weight_bits = 8;    ///< bits of the fake-quantized weights (2 to 8)
  /// Bits of the fake-quantized inputs of every Linear and Conv2d (per
  /// tensor, ranges learned as running averages); 0: float activations.
  int64_t activation_bits = 0;
  int64_t start_step = 0;     ///< optimizer steps trained in float first

  bool operator==(const QuantConfig&) const = default;
};

}  // namespace paratrain::train
