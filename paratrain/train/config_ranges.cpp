// The range checks of the config schema (config_ranges.h).
#include "paratrain/train/config_ranges.h"

#include <cfloat>
#include <cmath>

#include "paratrain/core/error.h"
#include "paratrain/optim/grad_scaler.h"

namespace paratrain::train::detail {

Check<double> in_range_finite(double lo, double hi, std::string note) {
  return [lo, hi, note](const double& v) {
    if (v >= lo && v <= hi) return std::string();
    return fmt::format("must be a number in [{}, {}]{}", lo, hi, note.empty() ? "" : " (" + note + ")");
  };
}

// See Note [Float32 keys] in config_ranges.h.
bool fits_float32(double v) {
  const double magnitude = std::fabs(v);
  return v == 0 || (magnitude >= FLT_MIN && magnitude <= FLT_MAX);
}

std::string float32_range() {
  return fmt::format("within float32's range [{:g}, {:g}] (it becomes a float32 tensor)",
                     static_cast<double>(FLT_MIN), static_cast<double>(FLT_MAX));
}

Check<double> positive_float32() {
  return [](const double& v) -> std::string {
    if (v > 0 && std::isfinite(v) && fits_float32(v)) return "";
    return "must be a finite number > 0 " + float32_range();
  };
}

Check<double> non_negative_float32() {
  return [](const double& v) -> std::string {
    if (v >= 0 && std::isfinite(v) && fits_float32(v)) return "";
    return "must be a finite number >= 0: 0, or " + float32_range();
  };
}

Check<std::string> loss_scale_form() {
  return [](const std::string& v) -> std::string {
    optim::GradScalerOptions parsed;
    try {
      parsed = optim::parse_loss_scale(v);
    } catch (const ConfigError&) {
      return "must be \"dynamic\", \"none\", or a positive number such as \"1024\" (a static scale)";
    }
    if (parsed.mode == optim::GradScalerOptions::Mode::kStatic) {
      if (!fits_float32(parsed.init_scale)) return "a static scale must be " + float32_range();
    }
    return "";
  };
}

Check<std::vector<double>> adam_betas() {
  return [](const std::vector<double>& v) -> std::string {
    if (v.size() != 2) return "needs exactly 2 entries [beta1, beta2]";
    for (double b : v)
      if (!(b >= 0 && b < 1)) return "each beta must be in [0, 1)";
    return "";
  };
}

Check<std::string> monitor_name() {
  return [](const std::string& v) -> std::string {
    if (v.empty() || v == "perplexity" || v == "train_loss") return "";
    if (v.rfind("test_", 0) == 0 && v.size() > 5) return "";
    return "must be \"test_loss\", \"test_accuracy\", \"perplexity\", \"train_loss\", \"test_<name>\" of the "
           "program's Task, or \"\"";
  };
}

}  // namespace paratrain::train::detail
