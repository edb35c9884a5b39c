// The smallest Trainer run the run-output tests share (versions, callbacks,
// TensorBoard): an MLP on 128 synthetic 8x8 images, batch 16 per rank, so a
// 2-rank epoch is 4 steps and a run takes a fraction of a second.
#pragma once

#include <string>

#include "paratrain/train/config/config.h"

namespace paratrain::testing {

inline train::TrainConfig tiny_run_config(const std::string& output_dir, const std::string& name, int64_t epochs,
                                          int64_t log_every) {
  train::TrainConfig c;
  c.run.name = name;
  c.run.output_dir = output_dir;
  c.run.seed = 3;
  c.run.log_every = log_every;
  c.model.hidden = {16};
  c.data.dataset = "synthetic";
  c.data.synthetic_train_size = 128;
  c.data.synthetic_test_size = 64;
  c.data.synthetic_image_size = 8;
  c.data.batch_size = 16;
  c.train.epochs = epochs;
  return c;
}

}  // namespace paratrain::testing
