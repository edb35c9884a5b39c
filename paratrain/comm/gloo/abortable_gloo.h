// c10d's ProcessGroupGloo with what paratrain's Gloo group needs that c10d
// 1.13 keeps protected: its Gloo contexts, to fail every connection (abort)
// and to make Gloo's own timeout a backstop once connected (Note [Gloo's
// deadline is ours] in gloo_work.h). Internal to comm/gloo.
#pragma once

#include <chrono>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "paratrain/comm/gloo/gloo_work.h"
#include "paratrain/core/compat.h"

namespace paratrain::comm::gloo_detail {

class AbortableGloo final : public c10d::ProcessGroupGloo {
 public:
  using c10d::ProcessGroupGloo::ProcessGroupGloo;

  // Whether this build can reach Gloo's connections at all (Note [Gloo's
  // internals on LibTorch 2.x] in abortable_gloo.cpp): when it cannot, the
  // two calls below do nothing, and Gloo's own timeout stays world.timeout_s.
  static const bool kReachesConnections;

  // Connected within world.timeout_s, Gloo's own timeout becomes the
  // backstop for the operations (Note [Gloo's deadline is ours]).
  void use_backstop_timeout();

  // Puts every connection of this group into Gloo's error state: pending
  // sends/receives fail at once (waking the Gloo worker threads), later ones
  // fail when posted, and the sockets close, so peers' device threads see EOF.
  void fail_connections() noexcept;
};

}  // namespace paratrain::comm::gloo_detail
