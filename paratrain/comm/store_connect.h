// Connecting to the rendezvous store (internal to paratrain/comm): rank 0
// serves it, or the launcher's agent store (ours, authenticated with the
// job's token) or torchrun's; the others connect. Split from rendezvous.cpp,
// which builds the groups over it.
#pragma once

#include <string>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "paratrain/comm/rendezvous.h"

namespace paratrain::comm {

// Whether `addr` names this machine (a loopback address or one of its own).
bool is_local_address(const std::string& addr);

// The store for `world`: served (rank 0 without an agent store) or
// connected. `where` is set to describe it for messages ("TCPStore at
// host:port", or the authenticated store's). Refuses, with one line each, a
// rank without the token meeting an authenticated store, a store that
// answers for another job, and one that cannot be reached in
// options.timeout.
c10::intrusive_ptr<c10d::Store> connect_store(const WorldInfo& world, const InitOptions& options,
                                              std::string& where);

}  // namespace paratrain::comm
