// The authenticated store's keys and the requests that read and change them,
// with c10d's semantics (TCPStore/HashStore). No sockets, no threads: the
// server (server.cpp) owns one table and calls it from its loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "paratrain/comm/auth_store/wire.h"

namespace paratrain::comm::auth {

// A wait request the table cannot answer yet: the server parks the
// connection until every key exists or the deadline passes.
struct PendingWait {
  std::vector<std::string> keys;
  std::optional<std::chrono::steady_clock::time_point> deadline;  // none: wait forever
};

struct Outcome {
  bool malformed = false;            // drop the connection: not our protocol
  bool changed = false;              // keys were written: parked waits may be ready
  std::optional<PendingWait> park;   // no reply yet
  std::vector<std::uint8_t> reply;   // the reply frame, when neither of the above
};

class KeyTable {
 public:
  // Applies one request body (Op | arguments).
  Outcome apply(Reader& request, std::chrono::steady_clock::time_point now);
  bool has_all(const std::vector<std::string>& keys) const;

 private:
  std::unordered_map<std::string, std::vector<std::uint8_t>> keys_;
};

// Reply frames the server sends on its own.
std::vector<std::uint8_t> reply_status(Status status);

}  // namespace paratrain::comm::auth
