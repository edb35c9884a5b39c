// The small run the freezing and QAT tests share: a 3-layer MLP (fc0 888, fc1 400, fc2 170
// of 1458 elements) on synthetic 6x6 images, global batch 24 (divides over
// 1, 2 and 3 ranks), 12 Adam steps, no evaluation.
#pragma once

#include <string>

#include "paratrain/train/config/config.h"

namespace paratrain::testing {

inline train::TrainConfig small_mlp_config(const std::string& dir) {
  train::TrainConfig c;
  c.run.name = "t";
  c.run.output_dir = dir;
  c.run.seed = 11;
  c.run.log_every = 0;
  c.model.kind = "mlp";
  c.model.hidden = {24, 16};
  c.data.dataset = "synthetic";
  c.data.synthetic_train_size = 480;
  c.data.synthetic_test_size = 96;
  c.data.synthetic_image_size = 6;
  c.data.global_batch_size = 24;
  c.optimizer.kind = "adam";
  c.optimizer.lr = 0.003;
  c.train.epochs = 1;
  c.train.max_steps = 12;
  c.train.eval_every_epochs = 0;
  return c;
}

}  // namespace paratrain::testing
