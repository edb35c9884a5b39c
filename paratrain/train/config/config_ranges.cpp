// The range checks of the config schema (config_ranges.h).
#include "paratrain/train/config/config_ranges.h"

#include <algorithm>
#include <cctype>
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

// A child-module name list for zero.unit_modules: "" or comma-separated
// names of letters, digits and '_' (LibTorch's register_module names: "fc0",
// or "0" inside a Sequential), spaces around commas allowed, no repeats.
Check<std::string> module_list() {
  return [](const std::string& v) -> std::string {
    std::vector<std::string> seen;
    size_t begin = 0;
    while (begin <= v.size() && !v.empty()) {
      const size_t end = std::min(v.find(',', begin), v.size());
      std::string name = v.substr(begin, end - begin);
      name.erase(0, name.find_first_not_of(' '));
      name.erase(name.find_last_not_of(' ') + 1);
      const auto bad = std::find_if(name.begin(), name.end(), [](char c) {
        return !(std::isalnum(static_cast<unsigned char>(c)) || c == '_');
      });
      if (name.empty() || bad != name.end())
        return fmt::format(
            "must be comma-separated child module names (letters, digits, '_'), e.g. \"fc0,fc1\"; "
            "'{}' is not one", name);
      if (std::find(seen.begin(), seen.end(), name) != seen.end())
        return fmt::format("names '{}' twice; list each module once", name);
      seen.push_back(name);
      begin = end + 1;
    }
    return "";
  };
}

// run.name is one folder under run.output_dir, never a path out of it.
Check<std::string> path_component() {
  return [](const std::string& v) -> std::string {
    if (v.empty()) return "must not be empty";
    // A newline or another control character in a folder name breaks every
    // line-based tool that lists it (`paratrain runs`, ls, logs).
    if (std::any_of(v.begin(), v.end(), [](char c) { return std::iscntrl(static_cast<unsigned char>(c)); }))
      return "must be one folder name without control characters (a newline, a tab): use letters, digits, "
             "'-', '_', '.' or spaces";
    if (v.find('/') != std::string::npos || v.find('\0') != std::string::npos || v.front() == '.')
      return "must be one folder name inside run.output_dir: no '/', and not starting with '.' "
             "(so not '..' or a hidden folder); put the parent folder in run.output_dir instead";
    return "";
  };
}
Check<std::string> one_of(std::vector<std::string> allowed) {
  return [allowed](const std::string& v) -> std::string {
    if (std::find(allowed.begin(), allowed.end(), v) != allowed.end()) return "";
    return fmt::format("allowed values are \"{}\"", fmt::join(allowed, "\", \""));
  };
}
// Like one_of, but the list is read when the value is checked: model.kind and
// data.dataset also accept names the program registered (registry.h).
Check<std::string> one_of_now(std::vector<std::string> (*allowed)()) {
  return [allowed](const std::string& v) { return one_of(allowed())(v); };
}
Check<std::string> non_empty() {
  return [](const std::string& v) { return v.empty() ? "must not be empty" : ""; };
}
Check<std::vector<int64_t>> widths(size_t min_size) {
  return [min_size](const std::vector<int64_t>& v) -> std::string {
    if (v.size() < min_size) return fmt::format("needs at least {} entries", min_size);
    if (v.size() > 1024) return "needs at most 1024 entries";
    for (int64_t x : v)
      if (x < 1 || x > kMaxWidth) return fmt::format("every entry must be in [1, {}]", kMaxWidth);
    return "";
  };
}


}  // namespace paratrain::train::detail
