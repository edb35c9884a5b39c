// A small convolutional classifier for images:
//   conv3x3(c0)-[bn]-relu-maxpool2, conv3x3(c1)-[bn]-relu-maxpool2, fc(hidden)-relu, fc(classes).
// Convolutions are zero-padded so only the pooling shrinks the image.
// Parameters: conv0.*, conv1.*, fc0.*, fc1.*, with batchnorm also bn0.0.*,
// bn1.0.* (see make_cnn).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "paratrain/models/model.h"

namespace paratrain::models {

struct CnnOptions {
  int64_t in_channels = 1;
  // Height = width of the (square) input images; must be >= 4 (two poolings).
  int64_t image_size = 28;
  int64_t num_classes = 10;
  // Output channels of each conv block; more blocks halve the image again.
  // More channels: more accuracy per step, more compute per step.
  std::vector<int64_t> channels{32, 64};
  // Width of the fully connected layer between the convs and the logits.
  int64_t hidden = 128;
  // BatchNorm2d after each conv (before the ReLU). Each sits alone in a
  // Sequential named bn<i> (parameters bn0.0.weight, ...), so
  // convert_sync_batchnorm can swap it for a SyncBatchNorm: the forward
  // calls it through the container, which a conversion can update.
  bool batchnorm = false;
};

// Accepts [B, C, H, W] or flattened [B, C*H*W] input (what an IDX loader
// gives). Deterministic under torch::manual_seed; throws c10::Error on
// sizes that leave no pixels after pooling.
std::shared_ptr<Model> make_cnn(const CnnOptions& options);

}  // namespace paratrain::models
