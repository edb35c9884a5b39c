// Reading sharded checkpoints: load_sharded_checkpoint (any layout into the
// caller's slots), consolidate_checkpoint and describe_checkpoint. The chunk
// bookkeeping and file verification are ShardedReader's (checkpoint_index.*).
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "paratrain/core/error.h"
#include "paratrain/checkpoint/checkpoint_index.h"
#include "paratrain/checkpoint/checkpoint_metadata.h"
#include "paratrain/checkpoint/checksum.h"
#include "paratrain/checkpoint/optimizer_state.h"
#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/checkpoint/sharded.h"

namespace paratrain::checkpoint {
namespace {

std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// The slot's elements of global tensor `name` (its runs, see TensorSlot),
// shaped like `like`, after checking that the checkpoint's tensor is the one
// the slot expects.
at::Tensor read_slot(ShardedReader& reader, const std::string& name, const std::vector<int64_t>& global_shape,
                     const std::vector<SlotSegment>& runs, const at::Tensor& like) {
  if (!reader.index().tensors.count(name))
    throw CheckpointError(fmt::format("checkpoint '{}' has no tensor '{}' that the model needs: was it saved from a "
                                      "different model? (check the [model] section of the config)",
                                      reader.where(), name));
  const IndexTensor& t = reader.tensor(name);
  if (t.shape != global_shape || t.dtype != like.scalar_type())
    throw CheckpointError(fmt::format("checkpoint '{}': tensor '{}' is {} {} in the checkpoint but {} {} here",
                                      reader.where(), name, c10::toString(t.dtype), shape_str(t.shape),
                                      c10::toString(like.scalar_type()), shape_str(global_shape)));
  for (const SlotSegment& run : runs) {
    TORCH_CHECK(run.global_offset >= 0 && run.global_offset + run.numel <= numel_of(global_shape) &&
                    run.local_offset >= 0 && run.local_offset + run.numel <= like.numel(),
                "load_sharded_checkpoint: slot of '", name, "' maps local elements [", run.local_offset, ", ",
                run.local_offset + run.numel, ") of ", like.numel(), " to [", run.global_offset, ", ",
                run.global_offset + run.numel, ") of ", numel_of(global_shape));
  }
  if (runs.size() == 1 && runs[0].local_offset == 0 && runs[0].numel == like.numel()) {
    return reader.read_range(name, runs[0].global_offset, like.numel()).reshape(like.sizes());
  }
  at::Tensor out = at::empty({like.numel()}, like.options().device(at::kCPU));
  for (const SlotSegment& run : runs) {
    if (run.numel > 0) out.narrow(0, run.local_offset, run.numel).copy_(reader.read_range(name, run.global_offset, run.numel));
  }
  return out.reshape(like.sizes());
}

// How many elements of `t` are NaN or +-inf (0 for integer tensors).
int64_t non_finite_count(const at::Tensor& t) {
  if (!at::isFloatingType(t.scalar_type()) || t.numel() == 0) return 0;
  return t.numel() - t.isfinite().sum().item<int64_t>();
}

// Note [Non-finite checkpoints]
// A NaN or inf in the weights or the optimizer state cannot be trained out
// of (an inf in Adam's exp_avg_sq makes every later update of that element
// NaN). A load refuses them before anything is changed, like any damage:
// train.resume = auto then falls back to an older checkpoint instead of
// stopping, or diverging steps later. consolidate copies them as they are
// but warns (a diverged run is still worth a post-mortem).
void check_finite(const at::Tensor& t, const std::string& name, const std::string& where) {
  if (const int64_t bad = non_finite_count(t); bad > 0)
    throw CheckpointError(fmt::format("checkpoint '{}': '{}' holds {} non-finite value(s) (NaN or inf) of {}: "
                                      "training from it cannot recover. Resume from an earlier checkpoint "
                                      "(train.resume = auto falls back by itself) or lower the learning rate",
                                      where, name, bad, t.numel()));
}

const torch::optim::OptimizerOptions& group_options_of(const torch::optim::Optimizer& optimizer,
                                                       const at::Tensor& param, const std::string& name) {
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params())
      if (p.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return group.options();
  throw std::invalid_argument(
      fmt::format("load_sharded_checkpoint: the param of optimizer slot '{}' is not in the optimizer", name));
}

// consolidate -o CK/rank_0.safetensors would overwrite a shard it reads (and
// any output inside CK adds a file to the checkpoint): refused up front.
void refuse_output_inside(const std::filesystem::path& checkpoint, const std::filesystem::path& out_file) {
  std::error_code ec;
  const auto in = std::filesystem::weakly_canonical(std::filesystem::absolute(checkpoint), ec);
  const auto out = std::filesystem::weakly_canonical(std::filesystem::absolute(out_file), ec);
  if (ec) return;  // the read or the write reports what is wrong with the paths
  const auto [mismatch, rest] = std::mismatch(in.begin(), in.end(), out.begin(), out.end());
  if (mismatch != in.end()) return;  // `out` is not `in` nor below it
  auto suggestion = in;
  suggestion += ".consolidated.safetensors";
  throw CheckpointError(fmt::format(
      "the output '{}' is {} the checkpoint '{}' it reads from: writing it would {}. Write it elsewhere, e.g. -o {}",
      out_file.string(), out == in ? "the same file as" : "inside", checkpoint.string(),
      out == in ? "replace the checkpoint" : "overwrite or add to the checkpoint's files", suggestion.string()));
}

}  // namespace

TrainingState load_sharded_checkpoint(const std::filesystem::path& checkpoint, const CheckpointContents& contents,
                                      const LoadCheckpointOptions& options) {
  ShardedReader reader(checkpoint);
  const std::string& where = reader.where();
  TrainingState state = training_state_from_metadata(reader.index().metadata, where);

  // Read and check everything before touching the caller's tensors.
  std::vector<at::Tensor> model_values;
  for (const TensorSlot& s : contents.model) {
    const std::string name = std::string(kModelPrefix) + s.name;
    model_values.push_back(read_slot(reader, name, s.global_shape, slot_segments(s), s.local));
    check_finite(model_values.back(), name, where);  // Note [Non-finite checkpoints]
  }

  std::vector<std::pair<compat::OptimizerStateKey, std::unique_ptr<torch::optim::OptimizerParamState>>> new_states;
  if (contents.optimizer != nullptr && !contents.optimizer_slots.empty()) {
    const OptimizerStateIo& io = optimizer_state_io(*contents.optimizer, where);
    check_optimizer_kind(reader.index().metadata, io, where);
    for (const OptimizerSlot& os : contents.optimizer_slots) {
      TORCH_CHECK(os.param.numel() == os.slot.local.numel(), "load_sharded_checkpoint: optimizer slot '",
                  os.slot.name, "' has a param of ", os.param.numel(), " elements but a slot of ",
                  os.slot.local.numel());
      const std::string prefix = fmt::format("{}{}/", kOptimizerPrefix, os.slot.name);
      std::map<std::string, at::Tensor> fields;
      const auto& tensors = reader.index().tensors;
      for (auto it = tensors.lower_bound(prefix); it != tensors.end() && it->first.starts_with(prefix); ++it) {
        const std::string field = it->first.substr(prefix.size());
        fields.emplace(field, io.is_scalar_field(field)
                                  ? reader.read_whole(it->first)
                                  : read_slot(reader, it->first, os.slot.global_shape,
                                              slot_segments(os.slot), os.param));
        check_finite(fields.at(field), it->first, where);
      }
      if (fields.empty()) continue;  // saved before this parameter's first step
      new_states.emplace_back(optimizer_state_key(os.param),
                              io.load(fields, os.param, group_options_of(*contents.optimizer, os.param, os.slot.name),
                                      prefix, where));
    }
  }
  std::vector<at::Tensor> state_values;  // undefined: missing
  for (const TensorSlot& s : contents.strategy_state) {
    const std::string name = std::string(kStatePrefix) + s.name;
    const auto it = reader.index().tensors.find(name);
    if (it == reader.index().tensors.end() || it->second.shape != s.global_shape ||
        it->second.dtype != s.local.scalar_type()) {
      state.missing_state.push_back(s.name);
      state_values.emplace_back();
    } else {
      state_values.push_back(read_slot(reader, name, s.global_shape, slot_segments(s), s.local));
      check_finite(state_values.back(), name, where);
    }
  }
  at::Tensor rng;
  if (options.restore_rng && reader.index().tensors.count(std::string(kRngKey)))
    rng = reader.read_whole(std::string(kRngKey));

  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < contents.model.size(); ++i) contents.model[i].local.copy_(model_values[i]);
    for (size_t i = 0; i < contents.strategy_state.size(); ++i)
      if (state_values[i].defined()) contents.strategy_state[i].local.copy_(state_values[i]);
  }
  if (contents.optimizer != nullptr && !contents.optimizer_slots.empty()) {
    contents.optimizer->state().clear();
    for (auto& [key, s] : new_states) contents.optimizer->state()[key] = std::move(s);
  }
  if (rng.defined()) {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    try {
      gen.set_state(rng);
    } catch (const c10::Error& e) {
      throw CheckpointError(fmt::format("checkpoint '{}': '{}' is not a CPU generator state of this LibTorch: {}",
                                        where, kRngKey, e.what_without_backtrace()));
    }
  }
  return state;
}

std::vector<std::string> consolidate_checkpoint(const std::filesystem::path& dir,
                                                const std::filesystem::path& out_file) {
  refuse_output_inside(dir, out_file);
  ShardedReader reader(dir);
  training_state_from_metadata(reader.index().metadata, reader.where());  // refuse what load_checkpoint would
  SafetensorsContents out;
  std::vector<std::string> non_finite;
  for (const auto& [name, t] : reader.index().tensors) {
    at::Tensor whole = reader.read_whole(name);
    if (const int64_t bad = non_finite_count(whole); bad > 0) {
      spdlog::warn("{}: '{}' holds {} non-finite value(s) (NaN or inf) of {}; copied as they are (the run had "
                   "diverged: resume from an earlier checkpoint)",
                   reader.where(), name, bad, whole.numel());
      non_finite.push_back(name);
    }
    out.tensors.emplace(name, std::move(whole));
  }
  out.metadata = reader.index().metadata;
  write_safetensors(out_file, out);
  return non_finite;
}

std::vector<std::string> verify_checkpoint_files(const std::filesystem::path& checkpoint) {
  ShardedReader reader(checkpoint);  // the index and file sizes; a single file's own data checksum
  std::error_code ec;
  const auto dir = std::filesystem::is_directory(checkpoint, ec) ? checkpoint : checkpoint.parent_path();
  std::vector<std::string> problems;
  for (const IndexFile& f : reader.index().files) {
    if (!f.crc32) continue;  // a single file, verified when read above
    const auto path = dir / f.name;
    try {
      if (const uint32_t crc = file_crc32(path); crc != *f.crc32)
        problems.push_back(fmt::format("shard '{}' (rank {}) fails its checksum ({} {} in the index, {} computed): "
                                       "the file is corrupt",
                                       path.string(), f.rank, kChecksumAlgorithm, crc32_hex(*f.crc32),
                                       crc32_hex(crc)));
    } catch (const CheckpointError& e) {
      problems.push_back(e.what());
    }
  }
  return problems;
}

std::string describe_checkpoint(const std::filesystem::path& checkpoint) {
  ShardedReader reader(checkpoint);
  const CheckpointIndex& index = reader.index();
  const auto& m = index.metadata;
  auto meta = [&](const std::string& key) {
    auto it = m.find(key);
    return it == m.end() ? std::string("?") : it->second;
  };
  std::ostringstream out;
  out << fmt::format("checkpoint {}\n", reader.where());
  if (std::filesystem::is_directory(checkpoint)) out << fmt::format("  layout: sharded ({})\n", kIndexFormat);
  else out << "  layout: single file\n";
  out << fmt::format("  format: {}  step: {}  epoch: {}  batch_in_epoch: {}  optimizer: {}\n", meta("format"),
                     meta("step"), meta("epoch"), meta("batch_in_epoch"), meta("optimizer"));
  for (const auto& [k, v] : m)
    if (k.starts_with("extra.")) out << fmt::format("  {}: {}\n", k, v);
  // An int8 file of `paratrain quantize` (train/inference/trained_model.h).
  for (const auto& [k, v] : m)
    if (k.starts_with("quant.")) out << fmt::format("  {}: {}\n", k, v);
  out << fmt::format("  world size: {}\n", index.world_size);
  out << "  files:\n";
  for (const IndexFile& f : index.files)
    out << fmt::format("    rank {:>3}  {}  {} bytes  {} {}\n", f.rank, f.name, f.bytes, kChecksumAlgorithm,
                       f.crc32 ? crc32_hex(*f.crc32) : std::string("(in the file's data_crc32)"));
  out << fmt::format("  tensors ({}):\n", index.tensors.size());
  for (const auto& [name, t] : index.tensors) {
    out << fmt::format("    {}  {} {}  {} chunk(s)\n", name, safetensors_dtype_name(t.dtype).value_or("?"),
                       shape_str(t.shape), t.chunks.size());
    for (const ChunkRef& c : t.chunks)
      out << fmt::format("      [{}, {})  {}  {}\n", c.offset, c.offset + c.numel, c.file, c.key);
  }
  return out.str();
}

}  // namespace paratrain::checkpoint
