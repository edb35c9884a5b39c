// The loss's sequence window (sequence_window.h).
#include "paratrain/train/distill/sequence_window.h"

namespace paratrain::train {
namespace {
thread_local SequenceWindow window;
}  // namespace

SequenceWindow current_sequence_window() { return window; }

SequenceWindowScope::SequenceWindowScope(int64_t begin, int64_t count) : previous_(window) { window = {begin, count}; }

SequenceWindowScope::~SequenceWindowScope() { window = previous_; }

}  // namespace paratrain::train
