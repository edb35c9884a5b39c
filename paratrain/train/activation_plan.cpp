// The activation planner: see activation_plan.h and Note [Activation formulas].
#include "paratrain/train/activation_plan.h"

#include <algorithm>

#include <fmt/format.h>

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
// are not counted). Activation checkpointing keeps a segment's input only,
// and re-makes one segment's activations at a time in backward.
constexpr int64_t kF = 4;  // fp32
constexpr int64_t kId = 8; // int64 ids, indices
// A recomputed segment also keeps the state of the random stream its forward
// started from (the CPU generator's: 5056 bytes) to replay it.
constexpr int64_t kRandomState = 5056;

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
    LayerActivations l{.name = fmt::format("fc{}", i), .input_bytes = kF * b * width};
    l.parameters = width * widths[i] + widths[i];
    // ReLU's output is the next layer's input; the last layer's logits and
    // the loss's log-softmax stay, with the targets.
    if (last) l.saved_bytes = 2 * kF * b * widths[i] + kId * b;
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
    LayerActivations l{.name = fmt::format("conv{}", i), .input_bytes = kF * b * ch * side * side};
    l.parameters = ch * o * 9 + o + (c.model.batchnorm ? 2 * o : 0);
    const int64_t maps = b * o * side * side;
    // BatchNorm keeps the convolution's output; ReLU its own; pooling its
    // input (ReLU's output) and int64 indices of its output.
    l.saved_bytes = (c.model.batchnorm ? kF * maps : 0) + kF * maps + kId * b * o * (side / 2) * (side / 2);
    out.push_back(l);
    ch = o;
    side /= 2;
  }
  const int64_t flat = ch * side * side;
  out.push_back({.name = "fc0", .input_bytes = kF * b * flat, .saved_bytes = 0,
                 .parameters = flat * c.model.cnn_hidden + c.model.cnn_hidden});
  out.push_back({.name = "fc1", .input_bytes = kF * b * c.model.cnn_hidden,
                 .saved_bytes = 2 * kF * b * in.classes + kId * b,
                 .parameters = c.model.cnn_hidden * in.classes + in.classes});
  return out;
}

std::vector<LayerActivations> gpt_layers(const TrainConfig& c, int64_t b) {
  const int64_t t = std::max<int64_t>(1, c.parallel.tp), cp = std::max<int64_t>(1, c.parallel.cp);
  const int64_t s = c.model.seq_len / cp, h = c.model.d_model, a = c.model.heads, vocab = 256;
  const bool sp = c.parallel.megatron_sp && t > 1;
  const bool dropout = c.model.dropout > 0;
  const int64_t sbh = s * b * h, scores = a * s * s * b;
  const int64_t local = sp ? sbh / t : sbh;  // the tokens a rank's LayerNorms and residuals see
  std::vector<LayerActivations> out;
  // embed: the ids (the loader's inputs and targets), the positions, the
  // dropout noise.
  out.push_back({.name = "embed", .input_bytes = kId * s * b,
                 .saved_bytes = kId * s * b + kId * s + (dropout ? kF * local : 0),
                 .parameters = vocab * h / t + c.model.seq_len * h});
  for (int64_t i = 0; i < c.model.layers; ++i) {
    LayerActivations l{.name = fmt::format("blocks.{}", i), .input_bytes = kF * local};
    // Replicated over the tp group (or sequence chunks with SP): LayerNorm
    // outputs (the column layers' inputs: gathered full under SP), the
    // residual sum (ln2's input), row statistics, dropout noises.
    int64_t replicated = 2 * kF * sbh + kF * local + 4 * kF * (local / h);
    if (dropout) replicated += 2 * kF * local;
    // Split over tp: q, k, v; the attention output (proj's input); GELU's
    // input and output; the scores (softmax output; with dropout its noise
    // and output too); the causal mask.
    int64_t split = (3 + 1 + 8) * kF * sbh / t + kF * scores / t;
    if (dropout) split += 2 * kF * scores / t;
    l.saved_bytes = replicated + split + s * s;
    l.parameters = (12 * h * h + 7 * h) / t + 6 * h;
    out.push_back(l);
  }
  // head: ln_f's input and output (gathered under SP), the logits of this
  // rank's vocabulary columns and their log-softmax, the targets.
  out.push_back({.name = "head", .input_bytes = kF * local,
                 .saved_bytes = kF * sbh + 2 * kF * (local / h) + 2 * kF * s * b * vocab / t + kId * s * b,
                 .parameters = 2 * h + vocab * h / t});
  return out;
}

int64_t sum_kept(const std::vector<LayerActivations>& layers, const std::vector<int>& segment_of, int begin, int end,
                 int64_t* largest_segment) {
  int64_t kept = 0;
  for (int i = begin; i < end;) {
    const int id = segment_of[static_cast<size_t>(i)];
    if (id < 0) {
      kept += layers[i].input_bytes + layers[i].saved_bytes;
      ++i;
      continue;
    }
    int64_t segment = 0;
    kept += layers[i].input_bytes + kRandomState;  // all a segment keeps
    int j = i;
    for (; j < end && segment_of[static_cast<size_t>(j)] == id; ++j) segment += layers[j].input_bytes + layers[j].saved_bytes;
    *largest_segment = std::max(*largest_segment, segment);
    i = j;
  }
  return kept;
}

}  // namespace

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
    int64_t kept = 0, plain = 0, largest = 0, unused = 0;
    for (int mc = static_cast<int>(stage); mc < chunks; mc += static_cast<int>(pp)) {
      kept += sum_kept(layers, segment_of, bounds[mc], bounds[mc + 1], &largest);
      plain += sum_kept(layers, none, bounds[mc], bounds[mc + 1], &unused);
    }
    // A micro-batch in flight is one chunk's: with v chunks a rank's
    // in-flight count is over its chunks, each about 1/v of its layers.
    const int64_t flying = in_flight[static_cast<size_t>(stage)];
    const int64_t total = (flying * kept) / v + largest;
    if (total > plan.total_bytes || stage == 0) {
      plan.stage = static_cast<int>(stage);
      plan.in_flight = flying;
      plan.kept_bytes = kept;
      plan.unrecomputed_bytes = plain;
      plan.recompute_bytes = largest;
      plan.total_bytes = total;
    }
  }
  if (c.parallel.cp > 1) {
    plan.notes.push_back(fmt::format("activations: parallel.cp = {} divides the sequence; ring attention's blocks "
                                     "of scores are not counted",
                                     c.parallel.cp));
  }
  return plan;
}

}  // namespace paratrain::train
