// Internal to train/config/*_section.cpp: the range checks of the schema rows.
// Each returns "" when a value is allowed, else the rule it broke ("must be
// >= 1"), which config.cpp puts after "<key> = <value> is not allowed: ".
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace paratrain::train::detail {

// Note [Numeric bounds]
// Every numeric key has an upper bound, so no value that passes validation
// can overflow where the code converts it: a bucket cap in MiB becomes an
// int64 byte count (<= 1 TiB keeps it far inside), a timeout in seconds
// becomes milliseconds in 32-bit APIs (poll, Gloo; <= 7 days = 6.0e8 ms),
// and counts multiply with each other (batch x dp, width x width). The
// bounds are far above any run this library can do, not tuning advice.
constexpr int64_t kMaxCount = int64_t{1} << 40;       // steps, epochs, examples (a seed is never multiplied)
constexpr int64_t kMaxWidth = int64_t{1} << 24;       // a layer width or channel count
constexpr int64_t kMaxRanks = int64_t{1} << 20;       // one parallel axis
constexpr int64_t kMaxTimeoutS = 7 * 24 * 3600;       // 7 days
constexpr double kMaxBucketMiB = 1024.0 * 1024.0;     // 1 TiB
constexpr double kMinBucketMiB = 1.0 / (1024 * 1024);  // 1 byte

template <class T>
using Check = std::function<std::string(const T&)>;

template <class T>
Check<T> at_least(T lo) {
  return [lo](const T& v) { return v >= lo ? "" : fmt::format("must be >= {}", lo); };
}
template <class T>
Check<T> in_range(T lo, T hi) {
  return [lo, hi](const T& v) { return v >= lo && v <= hi ? "" : fmt::format("must be in [{}, {}]", lo, hi); };
}

// `note` says what the bounds mean in the key's unit ("1 byte to 1 TiB").
Check<double> in_range_finite(double lo, double hi, std::string note = "");

// Note [Float32 keys]
// Keys that become float32 tensors or tensor scalars (the learning rate,
// weight decay, epsilon, clip norm, the schedule's floor, a static loss
// scale) are applied to float parameters, and LibTorch refuses a double
// that does not fit ("value cannot be converted to type float without
// overflow", naming no key) only at run time. So these checks also bound
// the value by float32's normal range: at most FLT_MAX (3.4e38), and a
// nonzero value at least FLT_MIN (1.2e-38), below which it would round to
// a denormal or to 0 (an eps of 1e-300 would divide by zero).
Check<double> positive_float32();      // > 0, within float32 (lr, eps)
Check<double> non_negative_float32();  // 0, or > 0 within float32 (weight decay, clip norm, min_lr)
// True when `v` is 0 or within float32's normal range in magnitude.
bool fits_float32(double v);
// "within float32's range [1.17549e-38, 3.40282e+38] (...)": the rule's words.
std::string float32_range();

// precision.loss_scale: whatever optim::parse_loss_scale accepts, with a
// static scale within float32.
Check<std::string> loss_scale_form();
// train.monitor: "", a built-in metric, or "test_<name>" of a program's
// Task (train/task.h); whether the run logs it is known at its first
// evaluation (callbacks.cpp names the ones it does).
Check<std::string> monitor_name();
// optimizer.betas, federated.server_betas: two numbers in [0, 1).
Check<std::vector<double>> adam_betas();

Check<std::string> one_of(std::vector<std::string> allowed);
// Like one_of, but the list is read when the value is checked: model.kind and
// data.dataset also accept names the program registered (registry.h).
Check<std::string> one_of_now(std::vector<std::string> (*allowed)());
Check<std::string> non_empty();
// A list of layer widths: at least min_size entries, each in [1, kMaxWidth].
Check<std::vector<int64_t>> widths(size_t min_size);
// run.name: one folder under run.output_dir, never a path out of it.
Check<std::string> path_component();
// zero.unit_modules: "" or comma-separated child-module names.
Check<std::string> module_list();

}  // namespace paratrain::train::detail
