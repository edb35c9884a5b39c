// The loss's sequence window (loss_window.h).
#include "paratrain/train/distill/loss_window.h"

namespace paratrain::train {
namespace {
thread_local SequenceWindow window;
}  // namespace

SequenceWindow current_sequence_window() { return window; }

LossWindow::LossWindow(int64_t begin, int64_t count) : previous_(window) { window = {begin, count}; }

LossWindow::~LossWindow() { window = previous_; }

}  // namespace paratrain::train
