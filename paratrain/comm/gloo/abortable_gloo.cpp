// AbortableGloo: see abortable_gloo.h.
#include "paratrain/comm/gloo/abortable_gloo.h"

// Note [Gloo's internals on LibTorch 2.x]
// Reaching a connection means reading gloo::Context's protected members and
// calling gloo::transport::Context's virtuals, compiled from the gloo
// headers at hand. Debian's LibTorch 1.13 links Debian's libgloo, whose
// headers those are. A PyTorch 2.x wheel links a newer Gloo into
// libtorch_cpu and ships no gloo headers, so a CUDA build compiles against
// Debian's (third_party/vendor): its gloo::Context has no vtable and an
// extra member, so every offset and virtual slot read here would be another
// field's (the H200 run of 2026-11-28: heap corruption in every process
// that made a Gloo group). There, neither call below touches Gloo: its
// timeout stays world.timeout_s on the wall clock (a job suspended for
// longer fails its Gloo operations on waking), each operation's Gloo
// timeout is world.timeout_s too, so one whose peer died ends there and
// frees c10d's thread, and abort() marks the group without failing its
// connections (peers see it when this process exits).
#if !PARATRAIN_TORCH_AT_LEAST(2, 0)
#include <gloo/context.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/unbound_buffer.h>
#endif

namespace paratrain::comm::gloo_detail {

#if PARATRAIN_TORCH_AT_LEAST(2, 0)

const bool AbortableGloo::kReachesConnections = false;
void AbortableGloo::use_backstop_timeout() {}
void AbortableGloo::fail_connections() noexcept {}

#else

const bool AbortableGloo::kReachesConnections = true;

namespace {

// The transport context behind a gloo::Context (a protected member). Only
// virtual calls are made on it: torch links libgloo, we do not.
struct GlooContextAccess : ::gloo::Context {
  static ::gloo::transport::Context& transport(::gloo::Context& context) {
    return *(context.*(&GlooContextAccess::transportContext_));
  }
  // gloo::Context::setTimeout lives in libgloo, which we do not link.
  static void set_timeout(::gloo::Context& context, std::chrono::milliseconds timeout) {
    context.*(&GlooContextAccess::timeout_) = timeout;
    if (context.*(&GlooContextAccess::transportContext_)) transport(context).setTimeout(timeout);
  }
};

constexpr auto kBackstop = std::chrono::duration_cast<std::chrono::milliseconds>(kGlooBackstop);

}  // namespace

void AbortableGloo::use_backstop_timeout() {
  for (auto& context : contexts_)
    if (context) GlooContextAccess::set_timeout(*context, kBackstop);
}

// Puts every connection of this group into Gloo's error state: pending
// sends/receives fail at once (waking the Gloo worker threads), later ones
// fail when posted, and the sockets close, so peers' device threads see EOF.
// Gloo has a public way to do exactly that, but only as the reaction to an
// application-side timeout (the tcp transport's Context::signalException,
// whose header the Debian package cannot compile): so we post a receive on
// a slot nobody sends to and wait for it 1 ms. Best effort: if that fails
// (every pair already broken), the pairs are closed plainly, which ends
// the operations still waiting on them too.
void AbortableGloo::fail_connections() noexcept {
  // Far above the slots c10d derives from its collective counter.
  constexpr uint64_t kAbortSlot = uint64_t{0x7AB0} << 48;
  for (auto& context : contexts_) {
    if (!context || context->size < 2) continue;
    auto& transport = GlooContextAccess::transport(*context);
    char byte = 0;
    // Posting fails on a pair that is already broken (a dead peer): try the
    // next one; the timeout of one receive reaches every pair.
    for (int step = 1; step < context->size; ++step) {
      std::unique_ptr<::gloo::transport::UnboundBuffer> buffer;
      try {
        buffer = transport.createUnboundBuffer(&byte, 1);
        buffer->recv((context->rank + step) % context->size, kAbortSlot, 0, 1);
      } catch (...) {
        continue;
      }
      try {
        buffer->waitRecv(nullptr, std::chrono::milliseconds(1));
      } catch (...) {
        // Expected: the timeout's IoException.
      }
      break;
    }
    for (int peer = 0; peer < context->size; ++peer) {
      try {
        if (auto& pair = transport.getPair(peer)) pair->close();
      } catch (...) {
      }
    }
  }
}

#endif

}  // namespace paratrain::comm::gloo_detail
