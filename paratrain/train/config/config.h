// The training configuration: one TrainConfig read from a TOML file plus
// `--set section.key=value` overrides, validated once, saved next to a run.
// Not the CLI (apps/ parses flags) and not the Trainer (trainer.h uses this).
//
// Each section's struct is in the <group>_section.h of the component it
// configures, with its schema rows (type, doc line, range check) and its
// cross-key rules beside it in <group>_section.cpp: adding a key to a
// section is its field there and one schema line; a new section is a member
// below plus its rows in config_schema.cpp's list. Where a component has an
// options struct the section holds it (precision's GradScalerOptions), so
// the default is written once. Defaults train the MLP on Fashion-MNIST to
// >= 85% test accuracy in 3 epochs on 2 ranks; see Note [Default
// hyper-parameters] in config_schema.cpp.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "paratrain/train/config/distill_section.h"
#include "paratrain/train/config/federated_section.h"
#include "paratrain/train/config/freeze_section.h"
#include "paratrain/train/config/model_section.h"
#include "paratrain/train/config/optim_section.h"
#include "paratrain/train/config/parallel_section.h"
#include "paratrain/train/config/profile_section.h"
#include "paratrain/train/config/ps_section.h"
#include "paratrain/train/config/quant_section.h"
#include "paratrain/train/config/run_section.h"
#include "paratrain/train/config/user_table.h"
#include "paratrain/train/config/world_section.h"

namespace paratrain::models {
class Model;
}

namespace paratrain::train {

/// A whole configuration: one member per TOML section. Every key, its type,
/// default and meaning: `paratrain config --list` (docs/config-reference.md).
struct TrainConfig {
  RunConfig run;                ///< [run]
  ModelConfig model;            ///< [model]
  OptimizerConfig optimizer;    ///< [optimizer]
  LrConfig lr;                  ///< [lr]
  DataConfig data;              ///< [data]
  TrainLoopConfig train;        ///< [train]
  WorldConfig world;            ///< [world]
  ElasticConfig elastic;        ///< [elastic]
  DdpConfig ddp;                ///< [ddp]
  ParallelConfig parallel;      ///< [parallel]
  ZeroConfig zero;              ///< [zero]
  PipelineConfig pipeline;      ///< [pipeline]
  PrecisionConfig precision;    ///< [precision]
  LogConfig log;                ///< [log]
  PsConfig ps;                  ///< [ps]
  FederatedConfig federated;    ///< [federated]
  ProfileConfig profile;        ///< [profile]
  FreezeConfig freeze;          ///< [freeze]
  DistillConfig distill;        ///< [distill]
  QuantConfig quant;            ///< [quant]
  UserTable user;               ///< [user]: the program's own keys

  bool operator==(const TrainConfig&) const = default;
};

/// Reads `path`, then applies `overrides` ("optimizer.lr=0.01",
/// "model.hidden=[256,128]") in order, then validates. Every failure is a
/// ConfigError naming the file or override, the full key, and what to do.
TrainConfig load_config(const std::filesystem::path& path,
                        const std::vector<std::string>& overrides = {});

/// The same from TOML text; `source_name` names it in errors ("<string>").
TrainConfig config_from_toml_string(std::string_view toml_text,
                                    const std::vector<std::string>& overrides = {},
                                    std::string_view source_name = "<string>");

/// Applies one `key=value` override to `config` (validates only that key's type;
/// call validate_config afterwards).
void apply_override(TrainConfig& config, std::string_view assignment);

/// Checks every value range and cross-key rule; throws ConfigError.
void validate_config(const TrainConfig& config);

/// Every section and key, in schema order, with a doc comment per key: the
/// result parses back to an equal TrainConfig.
std::string to_toml(const TrainConfig& config);
nlohmann::json to_json(const TrainConfig& config);
/// Inverse of to_json (a checkpoint's metadata); same errors as a TOML file.
TrainConfig config_from_json(const nlohmann::json& json);

/// All valid keys ("run.name", ...), in schema order.
std::vector<std::string> config_keys();

/// True when the config's model is the built-in GPT (model.kind = "gpt"):
/// a language model over byte tokens, the one the megatron strategy cuts.
/// The one place that compares model.kind with "gpt".
bool builds_gpt(const TrainConfig& config);

/// Builds the model the config asks for, with input/output sizes taken from
/// the dataset (Fashion-MNIST: 1x28x28, 10 classes). Seed torch first.
std::shared_ptr<models::Model> make_model(const TrainConfig& config);
/// The shape of one example as the dataset gives it to the model
/// ([channels, height, width]): pipeline stages infer their boundary shapes
/// from it.
std::vector<int64_t> model_input_shape(const TrainConfig& config);

}  // namespace paratrain::train
