// The agent loop of a multi-agent launch (--rdzv-endpoint with --nnodes
// MIN:MAX): rendezvous, start this node's workers for the generation, stop
// them when the rendezvous says so, repeat. Not public API: launch() calls it.
#pragma once

#include <functional>
#include <string>

#include "paratrain/launch/launcher.h"
#include "paratrain/launch/signal_capture.h"

namespace paratrain::launch {

// `options` resolved as launch() resolves them; `heartbeat_dir(k)` makes the
// heartbeat folder of generation k ("" when there is none).
LaunchReport run_multi_agent(LaunchOptions options, const std::string& program, SignalCapture& signals,
                             const std::function<std::string(int)>& heartbeat_dir);

// Whether `host` names an address of this machine (it can bind to it): the
// agent there serves the rendezvous store.
bool is_this_host(const std::string& host);

}  // namespace paratrain::launch
