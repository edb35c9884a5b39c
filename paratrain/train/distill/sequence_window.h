// The sequence positions a loss call covers (Note [A loss over a sequence
// chunk]). Internal to paratrain/train.
#pragma once

#include <cstdint>

namespace paratrain::train {

/// Note [A loss over a sequence chunk]
/// Under context parallelism a rank's student logits cover its chunk of
/// every sequence (positions [begin, begin + count)), while the teacher's
/// logits of the same micro-batch cover whole sequences. The megatron
/// strategy opens a SequenceWindowScope around its loss calls; the
/// distillation loss compares the student with the teacher's logits of
/// those positions. The chunk's loss is its mean over the chunk's
/// predictions, and the mean over the cp ranks' equal chunks is the batch's
/// (as for the cross-entropy).
struct SequenceWindow {
  int64_t begin = 0;
  int64_t count = -1;  ///< -1: the whole sequence
};

/// The window of the loss being computed on this thread ({0, -1} outside one).
SequenceWindow current_sequence_window();

/// Sets this thread's window for its lifetime.
class SequenceWindowScope {
 public:
  SequenceWindowScope(int64_t begin, int64_t count);
  ~SequenceWindowScope();
  SequenceWindowScope(const SequenceWindowScope&) = delete;
  SequenceWindowScope& operator=(const SequenceWindowScope&) = delete;

 private:
  SequenceWindow previous_;
};

}  // namespace paratrain::train
