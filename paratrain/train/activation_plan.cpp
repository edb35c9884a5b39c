// The activation planner: see activation_plan.h and Note [Activation formulas].
#include "paratrain/train/activation_plan.h"

#include <algorithm>
#include <cmath>
#include <array>
#include <functional>
#include <limits>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/models/recompute.h"
#include "paratrain/pipeline/partition.h"
#include "paratrain/pipeline/schedule.h"
#include "paratrain/pipeline/simulate.h"
#include "paratrain/train/batch_size.h"
#include "paratrain/train/builders.h"
#include "paratrain/train/registry.h"

namespace paratrain::train {
namespace {

// Note [Activation formulas]
// What a layer's forward leaves for its backward, in this build's fp32
// (4-byte floats, 8-byte token ids and pooling indices), counted from the
// operations the built-in models run (models/mlp.cpp, cnn.cpp, gpt.cpp,
// parallel_gpt.cpp): a Linear keeps its input, ReLU its output, GELU its
// input, LayerNorm its input and two floats per row, softmax its output,
// max-pooling its input and int64 indices, an embedding its ids, and
// dropout (CPU LibTorch multiplies by a float noise tensor) that noise and
// its output where the next operation keeps it. The loss keeps the logits'
// log-softmax (the logits themselves stay alive as the step's output). A
// tensor two operations keep is counted once: ReLU's output is the next
// Linear's input.
//
// For one GPT block on s tokens, b sequences, width h, a heads, that is
// 64·s·b·h + 4·a·s²·b bytes, plus 8·s·b·h + 8·a·s²·b with dropout: the
// fp32 counterpart of Korthikanti et al. (arXiv 2205.05198, section 4.1:
// s·b·h·(34 + 5·a·s/h) in 16-bit with 1-byte dropout masks). With tensor
// parallelism over t ranks the attention (q, k, v, scores) and the MLP's
// wide activations are split: 16·s·b·h + 48·s·b·h/t + 4·a·s²·b/t (+ 8·s·b·h
// + 8·a·s²·b/t with dropout; the paper's 10 + 24/t in 16-bit, whose
// dropout masks are bytes); with Megatron-SP the LayerNorms, residuals
// and dropout act on s/t tokens too, while the column-parallel layers keep
// the gathered input (8·s·b·h), as paratrain's sequence-parallel entry does.
// Context parallelism divides s by cp (ring attention's per-block scores
// are not counted). A mixture-of-experts block (moe/moe.h) routes about
// top_k·s·b rows through its experts instead of s·b through one MLP: it
// keeps the router's probabilities (s·b·E floats), the gathered rows, each
// expert's input, GELU's input and output and the returned rows (11 floats
// per row and width against the dense MLP's 8 per token): an upper bound
// when tokens are dropped. Activation checkpointing keeps a segment's input only,
// and re-makes one segment's activations at a time in backward.
constexpr int64_t kF = 4;  // fp32
constexpr int64_t kId = 8; // int64 ids, indices
// A recomputed segment also keeps the state of the random stream its forward
// started from (the CPU generator's: 5056 bytes) to replay it.
constexpr int64_t kRandomState = 5056;

// Byte counts are computed in double (exact below 2^53 bytes, 8 PiB) and
// checked into int64: a valid config of a huge model with a long context
// must not wrap around into a small or negative plan.
int64_t bytes(double v) {
  if (!(v >= 0 && v < 9.0e18)) {
    throw ConfigError(fmt::format("paratrain plan: {:.3g} bytes of activations overflow a 64-bit count; check "
                                  "model.* sizes, model.seq_len and data.batch_size",
                                  v));
  }
  return static_cast<int64_t>(std::llround(v));
}

struct Shape {
  int64_t channels = 1, side = 28, classes = 10;
};

Shape image_shape(const TrainConfig& c) {
  if (c.data.dataset == "synthetic") return {c.data.synthetic_channels, c.data.synthetic_image_size, c.data.synthetic_classes};
  return {};
}

std::vector<LayerActivations> mlp_layers(const TrainConfig& c, int64_t b) {
  const Shape in = image_shape(c);
  std::vector<LayerActivations> out;
  int64_t width = in.channels * in.side * in.side;
  std::vector<int64_t> widths = c.model.hidden;
  widths.push_back(in.classes);
  for (size_t i = 0; i < widths.size(); ++i) {
    const bool last = i + 1 == widths.size();
    const double wi = static_cast<double>(widths[i]), rows = static_cast<double>(b);
    LayerActivations l{.name = fmt::format("fc{}", i), .input_bytes = bytes(kF * rows * static_cast<double>(width))};
    l.parameters = width * widths[i] + widths[i];
    l.largest_tensor = width * widths[i];
    // dL/dy and dL/dx; the first layer's input (the data) gets no gradient.
    l.grad_bytes = bytes(kF * rows * static_cast<double>((i == 0 ? 0 : width) + widths[i]));
    // ReLU's output is the next layer's input; the last layer's logits and
    // the loss's log-softmax stay, with the targets.
    if (last) l.saved_bytes = bytes(2 * kF * rows * wi + kId * rows);
    out.push_back(l);
    width = widths[i];
  }
  return out;
}

std::vector<LayerActivations> cnn_layers(const TrainConfig& c, int64_t b) {
  const Shape in = image_shape(c);
  std::vector<LayerActivations> out;
  int64_t ch = in.channels, side = in.side;
  for (size_t i = 0; i < c.model.channels.size(); ++i) {
    const int64_t o = c.model.channels[i];
    const double rows = static_cast<double>(b);
    LayerActivations l{.name = fmt::format("conv{}", i),
                       .input_bytes = bytes(kF * rows * static_cast<double>(ch * side * side))};
    l.parameters = ch * o * 9 + o + (c.model.batchnorm ? 2 * o : 0);
    l.largest_tensor = ch * o * 9;
    const double maps = rows * static_cast<double>(o * side * side);
    // BatchNorm keeps the convolution's output; ReLU its own; pooling its
    // input (ReLU's output) and int64 indices of its output.
    l.saved_bytes = bytes((c.model.batchnorm ? kF * maps : 0) + kF * maps +
                          kId * rows * static_cast<double>(o * (side / 2) * (side / 2)));
    // ReLU's backward: the gradient of its input beside the one of its output
    // (pooling's, as large), pooling's int64 indices freed by then.
    l.grad_bytes = bytes(1.25 * kF * maps);
    out.push_back(l);
    ch = o;
    side /= 2;
  }
  const int64_t flat = ch * side * side;
  const double rows = static_cast<double>(b);
  out.push_back({.name = "fc0", .input_bytes = bytes(kF * rows * static_cast<double>(flat)), .saved_bytes = 0,
                 .parameters = flat * c.model.cnn_hidden + c.model.cnn_hidden,
                 .largest_tensor = flat * c.model.cnn_hidden,
                 .grad_bytes = bytes(kF * rows * static_cast<double>(flat + c.model.cnn_hidden))});
  out.push_back({.name = "fc1", .input_bytes = bytes(kF * rows * static_cast<double>(c.model.cnn_hidden)),
                 .saved_bytes = bytes(2 * kF * rows * static_cast<double>(in.classes) + kId * rows),
                 .parameters = c.model.cnn_hidden * in.classes + in.classes,
                 .largest_tensor = c.model.cnn_hidden * in.classes,
                 .grad_bytes = bytes(kF * rows * static_cast<double>(c.model.cnn_hidden + 2 * in.classes))});
  return out;
}

std::vector<LayerActivations> gpt_layers(const TrainConfig& c, int64_t rows) {
  const double t = static_cast<double>(std::max<int64_t>(1, c.parallel.tp));
  const double cp = static_cast<double>(std::max<int64_t>(1, c.parallel.cp));
  const double s = std::floor(static_cast<double>(c.model.seq_len) / cp), b = static_cast<double>(rows);
  const double h = static_cast<double>(c.model.d_model), a = static_cast<double>(c.model.heads), vocab = 256;
  const bool sp = c.parallel.megatron_sp && t > 1;
  const bool dropout = c.model.dropout > 0;
  const double sbh = s * b * h, scores = a * s * s * b;
  const double local = sp ? sbh / t : sbh;  // the tokens a rank's LayerNorms and residuals see
  const double seq = static_cast<double>(c.model.seq_len);
  std::vector<LayerActivations> out;
  // embed: the ids (the loader's inputs and targets), the positions, the
  // dropout noise.
  out.push_back({.name = "embed", .input_bytes = bytes(kId * s * b),
                 .saved_bytes = bytes(kId * s * b + kId * s + (dropout ? kF * local : 0)),
                 .parameters = bytes(vocab * h / t + seq * h),
                 .largest_tensor = bytes(std::max(vocab * h / t, seq * h)),
                 .grad_bytes = bytes(kF * local)});
  // Replicated over the tp group (or sequence chunks with SP): LayerNorm
  // outputs (the column layers' inputs: gathered full under SP), the
  // residual sum (ln2's input), row statistics, dropout noises.
  double replicated = 2 * kF * sbh + kF * local + 4 * kF * (local / h);
  if (dropout) replicated += 2 * kF * local;
  // Split over tp: q, k, v; the attention output (proj's input); GELU's
  // input and output; the scores (softmax output; with dropout its noise
  // and output too); the causal mask.
  double split = (3 + 1 + 8) * kF * sbh / t + kF * scores / t;
  if (dropout) split += 2 * kF * scores / t;
  const double experts = static_cast<double>(c.model.moe_experts), k = static_cast<double>(c.model.moe_top_k);
  const double held = experts / static_cast<double>(std::max<int64_t>(1, c.parallel.ep));
  for (int64_t i = 0; i < c.model.layers; ++i) {
    const bool moe = c.model.moe_experts > 0 && (i + 1) % c.model.moe_every == 0;
    // In place of the dense MLP's GELU input and output (split over tp).
    const double routed = moe ? kF * sbh * (11 * k - 8 / t) + kF * s * b * experts : 0;
    const double mlp = 8 * h * h + 5 * h;  // the dense MLP, or one expert
    out.push_back({.name = fmt::format("blocks.{}", i), .input_bytes = bytes(kF * local),
                   .saved_bytes = bytes(replicated + split + s * s + routed),
                   // a MoE block: the router and its experts whole instead
                   // of the dense MLP (weights and fc's bias split, proj's bias whole)
                   .parameters = bytes((12 * h * h + 7 * h) / t + 6 * h +
                                       (moe ? held * mlp + h * experts - (8 * h * h + 4 * h) / t - h : 0)),
                   .largest_tensor = bytes(moe ? 4 * h * h : 4 * h * h / t),  // mlp.fc, mlp.proj (an expert's whole)
                   // the block's output gradient beside its widest one (GELU's
                   // or the scores'), whose forward twin backward has freed
                   .grad_bytes = bytes(kF * (std::max(scores / t, 4 * sbh / t) + local))});
  }
  // head: ln_f's input and output (gathered under SP), the logits of this
  // rank's vocabulary columns and their log-softmax, the targets.
  out.push_back({.name = "head", .input_bytes = bytes(kF * local),
                 .saved_bytes = bytes(kF * sbh + 2 * kF * (local / h) + 2 * kF * s * b * vocab / t + kId * s * b),
                 .parameters = bytes(2 * h + vocab * h / t),
                 .largest_tensor = bytes(vocab * h / t),
                 .grad_bytes = bytes(2 * kF * s * b * vocab / t)});  // the logits' and log-softmax's gradients
  return out;
}

int64_t sum_kept(const std::vector<LayerActivations>& layers, const std::vector<int>& segment_of, int begin, int end,
                 int64_t* largest_segment) {
  double kept = 0;
  for (int i = begin; i < end;) {
    const int id = segment_of[static_cast<size_t>(i)];
    if (id < 0) {
      kept += static_cast<double>(layers[i].input_bytes) + static_cast<double>(layers[i].saved_bytes);
      ++i;
      continue;
    }
    double segment = 0;
    kept += static_cast<double>(layers[i].input_bytes + kRandomState);  // all a segment keeps
    int j = i;
    for (; j < end && segment_of[static_cast<size_t>(j)] == id; ++j)
      segment += static_cast<double>(layers[j].input_bytes) + static_cast<double>(layers[j].saved_bytes);
    *largest_segment = std::max(*largest_segment, bytes(segment));
    i = j;
  }
  return bytes(kept);
}

// Note [Backward's working set]
// The forward's peak is everything the layers keep. Backward frees a
// layer's saved tensors once it has run, but while layer i runs backward
// it holds what layers 0..i still keep, the gradient of its output and the
// gradient of its widest activation (the saved tensor of the operation just
// run has been freed by then, so one wide gradient, not two, is new), and,
// for a recomputed segment, the activations it has just made again and its
// re-made output, from which the segment's backward starts (measured: the
// CNN's first block recomputed peaked 3 MB above the plan without it,
// bench/results/2026-11-28-memory-plan.md). With activation
// checkpointing that is the peak: the forward keeps only the segments'
// inputs. The plan takes the larger of the two.
int64_t backward_peak(const std::vector<LayerActivations>& layers, const std::vector<int>& segment_of, int begin,
                      int end) {
  double kept = 0, peak = 0;
  for (int i = begin; i < end;) {
    const int id = segment_of[static_cast<size_t>(i)];
    int j = i + 1;
    if (id >= 0) {
      while (j < end && segment_of[static_cast<size_t>(j)] == id) ++j;
    }
    double work = 0, remade = 0;
    for (int k = i; k < j; ++k) {
      work = std::max(work, static_cast<double>(layers[k].grad_bytes));
      remade += static_cast<double>(layers[k].input_bytes) + static_cast<double>(layers[k].saved_bytes);
    }
    // The segment's re-made output (the next layer's input, as large) is the
    // root of the segment's own backward and lives through it.
    if (id >= 0 && static_cast<size_t>(j) < layers.size()) remade += static_cast<double>(layers[j].input_bytes);
    if (id >= 0) {
      kept += static_cast<double>(layers[i].input_bytes + kRandomState);
      peak = std::max(peak, kept + remade + work);
    } else {
      kept += remade;
      peak = std::max(peak, kept + work);
    }
    i = j;
  }
  return bytes(peak);
}

}  // namespace

// Note [Communication buffers]
// What the data-parallel strategies keep beside the model state while a
// micro-batch's activations are alive (measured: bench/run_memory_plan.sh):
//   stages 0 (DDP) and 1: the reducer's flat bucket buffers, 4Ψ, beside
//     .grad (paratrain's DDP does not make .grad a view of its bucket: the
//     averaged buckets are copied back), when ddp.mode is "bucketed" and
//     more than one replica shares the gradients (dp x cp; no parameter
//     servers) (on the shm backend they are the group's symmetric memory,
//     which the meter counts too);
//   stage 2: the same 4Ψ of buckets, made as backward fills them and
//     reduce-scattered from;
//   stage 3 (FSDP): the unit being computed, gathered whole, and its full
//     gradient before the reduce-scatter: 8 bytes per element of the largest
//     unit (units group the model's top-level modules, a ModuleList's
//     entries each counting as one, until one holds zero.unit_min_params
//     elements, or one per zero.unit_modules name).
// ZeRO-1/2's parameter all-gather after the step (4Ψ + 4Ψ/N) comes when the
// activations are gone, below the peak of a step (Note [A finished job
// holds no tensors] in comm/shm/shm_group.cpp: before it, its buffers
// could outlive the step into the next backward).
std::array<int64_t, 4> communication_buffer_bytes(const TrainConfig& c, int64_t psi, int64_t dp) {
  // The root's children and their parameter counts, in order (fsdp/unit_plan.cpp cuts units from them).
  std::vector<std::pair<std::string, double>> children;
  const Shape in = image_shape(c);
  auto linear = [](int64_t i, int64_t o) { return static_cast<double>(i) * static_cast<double>(o) + static_cast<double>(o); };
  if (builds_gpt(c)) {
    const double d = static_cast<double>(c.model.d_model);
    // Under tp (FSDP over each tp rank's module) a unit holds that rank's
    // shards: wte's rows, qkv, mlp.fc and the row-parallel weights split,
    // wpe, the LayerNorms and the row-parallel biases whole.
    const double t = static_cast<double>(std::max<int64_t>(1, c.parallel.tp));
    // The size rule counts the blocks' ModuleList as its blocks; units by
    // name see the root's children (unit_plan.cpp).
    children = {{"wte", 256 * d / t}, {"wpe", static_cast<double>(c.model.seq_len) * d}};
    const double block = (12 * d * d + 7 * d) / t + 6 * d;
    // A MoE block: attention split as above, the router and every expert
    // (each the dense MLP's size) whole (ZeRO-3 runs without parallel.ep).
    const double experts = static_cast<double>(c.model.moe_experts);
    const double moe_block = (4 * d * d + 3 * d) / t + 5 * d + d * experts + experts * (8 * d * d + 5 * d);
    double blocks = 0;
    for (int64_t i = 0; i < c.model.layers; ++i) {
      const bool moe = c.model.moe_experts > 0 && (i + 1) % c.model.moe_every == 0;
      blocks += moe ? moe_block : block;
      if (c.zero.unit_modules.empty()) children.emplace_back(fmt::format("blocks.{}", i), moe ? moe_block : block);
    }
    if (!c.zero.unit_modules.empty()) children.emplace_back("blocks", blocks);
    children.emplace_back("ln_f", 2 * d);
  } else if (c.model.kind == "mlp") {
    int64_t width = in.channels * in.side * in.side;
    for (size_t i = 0; i < c.model.hidden.size(); ++i) {
      children.emplace_back(fmt::format("fc{}", i), linear(width, c.model.hidden[i]));
      width = c.model.hidden[i];
    }
    children.emplace_back(fmt::format("fc{}", c.model.hidden.size()), linear(width, in.classes));
  } else if (c.model.kind == "cnn") {
    int64_t ch = in.channels, side = in.side;
    for (size_t i = 0; i < c.model.channels.size(); ++i) {
      const int64_t o = c.model.channels[i];
      children.emplace_back(fmt::format("conv{}", i), static_cast<double>(ch * o * 9 + o));
      if (c.model.batchnorm) children.emplace_back(fmt::format("bn{}", i), static_cast<double>(2 * o));
      ch = o;
      side /= 2;
    }
    children.emplace_back("fc0", linear(ch * side * side, c.model.cnn_hidden));
    children.emplace_back("fc1", linear(c.model.cnn_hidden, in.classes));
  }
  std::vector<double> units;
  if (!c.zero.unit_modules.empty()) {
    // Each named child its own unit, every other parameter one root unit.
    double root = 0;
    for (const auto& [name, n] : children) {
      if (("," + c.zero.unit_modules + ",").find("," + name + ",") != std::string::npos) {
        units.push_back(n);
      } else {
        root += n;
      }
    }
    units.push_back(root);
  } else {
    double unit = 0;
    for (const auto& [name, n] : children) {
      unit += n;
      if (unit >= static_cast<double>(c.zero.unit_min_params)) units.push_back(unit), unit = 0;
    }
    if (unit > 0) units.push_back(unit);
  }
  std::sort(units.begin(), units.end(), std::greater<>());
  const double whole = [&] {
    double total = 0;
    for (double u : units) total += u;
    return total;
  }();
  double stage3 = 0;
  if (!units.empty() && c.parallel.pp <= 1 && (c.parallel.tp <= 1 || builds_gpt(c))) {
    const double largest = units[0], next = units.size() > 1 ? units[1] : 0;
    // Resharded after forward: the unit in use, gathered, and its full
    // gradient, plus the next unit's gather in flight (zero.prefetch). Kept
    // after forward: every unit stays gathered until its backward.
    stage3 = c.zero.reshard_after_forward ? kF * (2 * largest + (c.zero.prefetch ? next : 0))
                                          : kF * (whole + largest);
  }
  const int64_t buckets = bytes(kF * static_cast<double>(psi));
  // DDP's replicas: dp x cp under the megatron strategy; none with
  // parameter servers.
  const bool reducer = dp * std::max<int64_t>(1, c.parallel.cp) > 1 && c.ddp.mode == "bucketed" && c.ps.servers == 0;
  return {reducer ? buckets : 0, buckets, buckets, bytes(stage3)};
}

std::vector<LayerActivations> layer_activations(const TrainConfig& c, int64_t rows) {
  if (find_model(c.model.kind)) return {};
  if (builds_gpt(c)) return gpt_layers(c, rows);
  if (c.model.kind == "mlp") return mlp_layers(c, rows);
  if (c.model.kind == "cnn") return cnn_layers(c, rows);
  return {};
}

ActivationPlan plan_activations(const TrainConfig& c, int64_t dp) {
  ActivationPlan plan;
  const int64_t pp = std::max<int64_t>(1, c.parallel.pp);
  if (dp < 1 || dp > std::numeric_limits<int>::max())
    throw ConfigError(fmt::format("paratrain plan: {} data-parallel ranks is out of range", dp));
  const int64_t per_rank = resolve_batch_sizes(c, static_cast<int>(dp)).per_rank;
  plan.microbatch_rows = pp > 1 ? std::max<int64_t>(1, per_rank / c.pipeline.microbatches) : per_rank;
  const auto layers = layer_activations(c, plan.microbatch_rows);
  if (layers.empty()) {
    plan.modelled = false;
    plan.notes.push_back(fmt::format("activations: no formula for model.kind = \"{}\"; measure them with "
                                     "`paratrain plan --measure`",
                                     c.model.kind));
    return plan;
  }
  std::vector<std::string> names;
  for (const auto& l : layers) names.push_back(l.name);
  const std::vector<int> segment_of = models::recompute_segments(names, recompute_policy(c));
  const std::vector<int> none(layers.size(), -1);

  // The stages: as the pipeline cuts by parameters (pipeline.split when set);
  // a rank with several chunks (interleaved) holds their layers together.
  const int v = pp > 1 ? static_cast<int>(std::max<int64_t>(1, c.pipeline.virtual_stages)) : 1;
  const int chunks = static_cast<int>(pp) * v;
  std::vector<int> bounds{0, static_cast<int>(layers.size())};
  std::vector<int> in_flight(static_cast<size_t>(pp), 1);
  if (pp > 1) {
    std::vector<double> costs;
    for (const auto& l : layers) costs.push_back(static_cast<double>(l.parameters));
    bounds = c.pipeline.split.empty()
                 ? pipeline::balanced_partition(costs, chunks)
                 : pipeline::explicit_partition(c.pipeline.split, static_cast<int>(layers.size()), chunks);
    pipeline::ScheduleOptions shape;
    shape.stages = static_cast<int>(pp);
    shape.microbatches = static_cast<int>(c.pipeline.microbatches);
    shape.virtual_stages = v;
    in_flight = pipeline::simulate(pipeline::parse_schedule(c.pipeline.schedule), shape).peak_in_flight;
    if (c.pipeline.balance != "parameters" && c.pipeline.split.empty())
      plan.notes.push_back(fmt::format("activations: stages cut by parameters (pipeline.balance = \"{}\" cuts by "
                                       "measured times, which the plan cannot know)",
                                       c.pipeline.balance));
  }
  for (int64_t stage = 0; stage < pp; ++stage) {
    int64_t kept = 0, plain = 0, largest = 0, unused = 0, tensor = 0, last_backward = 0;
    for (int mc = static_cast<int>(stage); mc < chunks; mc += static_cast<int>(pp)) {
      int64_t chunk_kept = sum_kept(layers, segment_of, bounds[mc], bounds[mc + 1], &largest);
      const int64_t chunk_plain = sum_kept(layers, none, bounds[mc], bounds[mc + 1], &unused);
      if (pp > 1 && c.pipeline.checkpoint_activations) {
        // The pipeline's own recompute: a micro-batch keeps only the chunk's
        // input (and its random state); the chunk is re-made in backward.
        largest = std::max(largest, chunk_kept);
        chunk_kept = layers[bounds[mc]].input_bytes + kRandomState;
      } else if (mc + 1 < chunks) {
        // The executor keeps the output it sent, with its graph, until the
        // gradient comes back (the next chunk's input, on its own rank).
        chunk_kept += layers[bounds[mc + 1]].input_bytes;
      }
      // Backward's peak in this chunk, with what the rank's earlier chunks keep.
      if (!(pp > 1 && c.pipeline.checkpoint_activations)) {
        last_backward = std::max(last_backward, kept + backward_peak(layers, segment_of, bounds[mc], bounds[mc + 1]));
      }
      kept += chunk_kept;
      plain += chunk_plain + (mc + 1 < chunks ? layers[bounds[mc + 1]].input_bytes : 0);
      for (int j = bounds[mc]; j < bounds[mc + 1]; ++j) tensor = std::max(tensor, layers[j].largest_tensor);
    }
    // A micro-batch in flight is one chunk's: with v chunks a rank's
    // in-flight count is over its chunks, each about 1/v of its layers.
    const int64_t flying = in_flight[static_cast<size_t>(stage)];
    // The other micro-batches in flight keep their activations meanwhile.
    const int64_t total = std::max(
        bytes(static_cast<double>(flying) * static_cast<double>(kept) / v + static_cast<double>(largest)),
        bytes(static_cast<double>(flying - 1) * static_cast<double>(kept) / v + static_cast<double>(last_backward)));
    if (total + kF * tensor > plan.total_bytes + plan.transient_bytes || stage == 0) {
      plan.transient_bytes = kF * tensor;
      plan.stage = static_cast<int>(stage);
      plan.in_flight = flying;
      plan.kept_bytes = kept;
      plan.unrecomputed_bytes = plain;
      plan.recompute_bytes = largest;
      plan.total_bytes = total;
    }
  }
  // Note [Loader bytes]
  // The sampler holds this rank's positions of the epoch (int64, N / dp of
  // an in-memory dataset's N examples; a text corpus's windows are not
  // counted, their number depends on the file: ~8 bytes per 128-byte
  // window / dp), and data.prefetch batches wait ahead of the one being
  // computed (which the activations count as the first layer's input).
  {
    const double example_bytes =
        builds_gpt(c) ? 2.0 * kId * static_cast<double>(c.model.seq_len)
                      : kF * static_cast<double>(image_shape(c).channels * image_shape(c).side * image_shape(c).side) + kId;
    const int64_t examples = builds_gpt(c) ? 0
                             : c.data.dataset == "synthetic" ? c.data.synthetic_train_size
                                                             : 60000;  // Fashion-MNIST's training set
    plan.data_bytes = bytes(kId * static_cast<double>((examples + dp - 1) / dp) +
                            static_cast<double>(c.data.prefetch) * static_cast<double>(per_rank) * example_bytes);
  }
  if (c.parallel.cp > 1) {
    plan.notes.push_back(fmt::format("activations: parallel.cp = {} divides the sequence; ring attention's blocks "
                                     "of scores are not counted",
                                     c.parallel.cp));
  }
  return plan;
}

}  // namespace paratrain::train
