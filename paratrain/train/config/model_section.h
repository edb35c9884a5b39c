// [model] and [data]: the built-in models and datasets and how batches are cut.
// The sections of TrainConfig (config.h) that configure models/ and data/ (built by train/builders.h and config_model.cpp).
// Each key's type, doc line and range check, and the rules between keys, are
// beside them in model_section.cpp: adding a key is a field here and one line
// there.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace paratrain::train {

/// `[model]`: which built-in model and its sizes (user models: train/registry.h).
struct ModelConfig {
  std::string kind = "mlp";                 ///< "mlp" | "cnn" | "gpt"
  std::vector<int64_t> hidden{256, 128};    ///< MLP hidden widths
  std::vector<int64_t> channels{32, 64};    ///< CNN conv block channels
  int64_t cnn_hidden = 128;                 ///< CNN fully connected width
  int64_t layers = 4;      ///< GPT (data.dataset = "text"): decoder blocks
  int64_t d_model = 256;  ///< GPT: width of the residual stream
  int64_t heads = 4;      ///< GPT: attention heads (divide d_model)
  int64_t seq_len = 128;  ///< GPT: context length in tokens
  double dropout = 0.1;   ///< GPT: dropout probability
  /// GPT: experts of each mixture-of-experts block (0: every block's MLP is
  /// dense). moe/moe.h.
  int64_t moe_experts = 0;
  int64_t moe_top_k = 1;             ///< GPT: experts per token (1: Switch, 2: GShard)
  double moe_capacity_factor = 1.25; ///< GPT: slots per expert = ceil(factor * top_k * tokens / experts)
  int64_t moe_every = 2;             ///< GPT: every n-th block's MLP is a MoE layer (blocks n-1, 2n-1, ...)
  double moe_aux_loss = 0.01;        ///< GPT: weight of Switch's load-balancing loss in the training loss (moe/moe.h: Note [Aux losses in backward])
  bool batchnorm = false;                   ///< CNN: BatchNorm2d after each conv
  /// BatchNorm statistics over the whole dp batch (SyncBatchNorm); needs
  /// batchnorm = true. Costs two small all-reduces per BatchNorm layer.
  bool sync_batchnorm = false;

  bool operator==(const ModelConfig&) const = default;
};

/// data.batch_shares = "auto": the value the word stands for (no user writes
/// a negative share).
inline const std::vector<double> kAutoShares{-1.0};

/// `[data]`: the dataset and how it is batched over the ranks.
struct DataConfig {
  std::string dataset = "fashion_mnist";  ///< "fashion_mnist" | "synthetic" | "text"
  std::string dir = "/usr/share/datasets/fashion-mnist";  ///< Fashion-MNIST's IDX files (Debian's dataset-fashion-mnist)
  /// Text: a file or a folder of text files, tokenized as bytes into
  /// `<run.output_dir>/.cache/` once (data/text.h).
  std::string path = "/usr/share/games/fortunes";
  /// Per data-parallel rank and micro-batch: the global batch per optimizer
  /// step is batch_size * dp * train.accumulate.
  int64_t batch_size = 64;
  /// 0 = unset. Else the global batch per optimizer step; the per-rank batch is
  /// derived from it (global / (dp * train.accumulate)) and must divide evenly.
  /// Overrides batch_size.
  int64_t global_batch_size = 0;
  bool shuffle = true;      ///< reshuffle the training set every epoch (seeded by run.seed)
  bool drop_last = true;    ///< equal batch counts on every rank (no uneven last step)
  int64_t prefetch = 2;     ///< batches prepared ahead by the loader thread (0 = none)
  /// Speed-weighted data parallelism (docs/heterogeneous.md): each dp rank's
  /// relative share of every global batch, e.g. [2, 1, 1]; empty = equal
  /// shares (the strided split); kAutoShares ("auto" in a file) = measured
  /// and rebalanced every rebalance_every_steps steps.
  std::vector<double> batch_shares;
  int64_t rebalance_every_steps = 20;  ///< "auto": steps per measurement window
  /// "auto": the most a rank's share may grow or shrink per rebalance, as a
  /// fraction of it (damps oscillation from noisy measurements).
  double rebalance_max_change = 0.25;
  /// Synthetic data: images of synthetic_channels x synthetic_image_size^2
  /// labelled with synthetic_classes classes (the Fashion-MNIST shape by default).
  int64_t synthetic_train_size = 8192;
  int64_t synthetic_test_size = 2048;  ///< synthetic: examples in the test split
  int64_t synthetic_channels = 1;      ///< synthetic: image channels
  int64_t synthetic_image_size = 28;   ///< synthetic: image height and width
  int64_t synthetic_classes = 10;      ///< synthetic: label classes

  bool auto_shares() const { return batch_shares == kAutoShares; }  ///< "auto"

  bool operator==(const DataConfig&) const = default;
};

}  // namespace paratrain::train
