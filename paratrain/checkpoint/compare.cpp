// compare_checkpoints: two checkpoints read through ShardedReader, compared by
// tensor name in float64. Not a loader: nothing here touches a model, and the
// training metadata (step, config) is not compared, only tensors.
#include "paratrain/checkpoint/compare.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/checkpoint/checkpoint_index.h"
#include "paratrain/checkpoint/safetensors.h"

namespace paratrain::checkpoint {
namespace {

// The denominator's floor: only an all-zero reference reaches it, and then
// any nonzero difference is (rightly) an enormous relative one.
constexpr double kTiny = std::numeric_limits<double>::min();

bool selected(const std::string& name, const CompareOptions& options) {
  return options.all || name.starts_with(options.prefix);
}

ShardedReader open_checkpoint(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw CheckpointError(fmt::format("checkpoint compare: '{}' does not exist: pass a checkpoint directory "
                                      "(.../checkpoints/step_N) or a .safetensors file",
                                      path.string()));
  return ShardedReader(path);
}

std::string describe(const IndexTensor& t) {
  return fmt::format("{} [{}]", safetensors_dtype_name(t.dtype).value_or("?"), fmt::join(t.shape, ", "));
}

// max|a - b| and max|b| in float64, so integer state (Adam's step) and
// float16 tensors compare exactly and float32 rounding does not blur a
// difference near rtol. NaN anywhere propagates through max() to max_abs.
TensorDiff diff_of(const std::string& name, const at::Tensor& a, const at::Tensor& b, double rtol) {
  TensorDiff d;
  d.name = name;
  d.shape = b.sizes().vec();
  if (b.numel() == 0) {
    d.ok = true;
    return d;
  }
  const at::Tensor a64 = a.to(at::kDouble), b64 = b.to(at::kDouble);
  d.max_abs = (a64 - b64).abs().max().item<double>();
  const double scale = b64.abs().max().item<double>();
  d.rel = d.max_abs / std::max(scale, kTiny);
  d.ok = d.rel <= rtol;  // false for NaN
  return d;
}

}  // namespace

CompareReport compare_checkpoints(const std::filesystem::path& a, const std::filesystem::path& b,
                                  const CompareOptions& options) {
  TORCH_CHECK(options.rtol >= 0, "compare_checkpoints: rtol must be >= 0, got ", options.rtol);
  ShardedReader ra = open_checkpoint(a);
  ShardedReader rb = open_checkpoint(b);
  CompareReport report;
  report.rtol = options.rtol;
  const auto& ta = ra.index().tensors;
  const auto& tb = rb.index().tensors;
  for (const auto& [name, ia] : ta) {
    if (!selected(name, options)) continue;
    auto it = tb.find(name);
    if (it == tb.end()) {
      report.only_in_a.push_back(name);
      continue;
    }
    const IndexTensor& ib = it->second;
    if (ia.shape != ib.shape || ia.dtype != ib.dtype) {
      report.mismatched.push_back(fmt::format("{}: A is {}, B is {}", name, describe(ia), describe(ib)));
      continue;
    }
    // One tensor at a time: at most two whole tensors in float64 beyond what
    // the readers keep of their files.
    report.diffs.push_back(diff_of(name, ra.read_whole(name), rb.read_whole(name), options.rtol));
  }
  for (const auto& [name, ib] : tb)
    if (selected(name, options) && !ta.count(name)) report.only_in_b.push_back(name);
  return report;
}

bool CompareReport::ok() const {
  return !diffs.empty() && only_in_a.empty() && only_in_b.empty() && mismatched.empty() &&
         std::all_of(diffs.begin(), diffs.end(), [](const TensorDiff& d) { return d.ok; });
}

std::string CompareReport::format() const {
  std::ostringstream out;
  size_t width = 6;
  std::vector<std::string> shapes;
  for (const TensorDiff& d : diffs) {
    width = std::max(width, d.name.size());
    shapes.push_back(fmt::format("[{}]", fmt::join(d.shape, ", ")));
  }
  size_t shape_width = 5;
  for (const auto& s : shapes) shape_width = std::max(shape_width, s.size());
  out << fmt::format("{:<{}}  {:<{}}  {:>12}  {:>12}  {}\n", "tensor", width, "shape", shape_width, "max abs diff",
                     "rel diff", "status");
  const TensorDiff* worst = nullptr;
  for (size_t i = 0; i < diffs.size(); ++i) {
    const TensorDiff& d = diffs[i];
    out << fmt::format("{:<{}}  {:<{}}  {:>12.3e}  {:>12.3e}  {}\n", d.name, width, shapes[i], shape_width,
                       d.max_abs, d.rel, d.ok ? "OK" : "DIFF");
    // NaN is the worst of all; otherwise the largest rel.
    if (worst == nullptr || std::isnan(d.rel) || (!std::isnan(worst->rel) && d.rel > worst->rel)) worst = &d;
  }
  for (const auto& n : only_in_a) out << fmt::format("only in A: {}\n", n);
  for (const auto& n : only_in_b) out << fmt::format("only in B: {}\n", n);
  for (const auto& m : mismatched) out << fmt::format("shape/dtype mismatch: {}\n", m);
  if (!only_in_a.empty() || !only_in_b.empty() || !mismatched.empty())
    out << fmt::format("names differ: {} only in A, {} only in B, {} mismatched\n", only_in_a.size(),
                       only_in_b.size(), mismatched.size());
  if (worst == nullptr) {
    out << fmt::format("0 tensors compared: nothing to agree on (check --prefix, or pass --all)\n");
  } else {
    const bool within = std::all_of(diffs.begin(), diffs.end(), [](const TensorDiff& d) { return d.ok; });
    const bool names_differ = !only_in_a.empty() || !only_in_b.empty() || !mismatched.empty();
    // The last line is what people read: say here too when the names alone fail the comparison.
    out << fmt::format("{} tensors compared, worst relative difference {:.3e} ({}) — {} rtol {:g}{}\n", diffs.size(),
                       worst->rel, worst->name, within ? "within" : "exceeds", rtol,
                       names_differ ? "; names differ (listed above)" : "");
  }
  return out.str();
}

}  // namespace paratrain::checkpoint
