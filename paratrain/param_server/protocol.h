// The parameter-server wire protocol and roles: which ranks are servers,
// the three consistency modes, and the messages between workers and servers
// (one flat float tensor per worker-server pair and direction, a small
// header followed by that server's key ranges back to back). Not the
// partitioning (key_ranges.h), not the loops (server.h, worker.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace paratrain::param_server {

// See Note [Parameter-server modes] in server.h.
enum class Mode { kSync, kAsync, kSsp };
// "sync" | "async" | "ssp"; throws ConfigError naming ps.mode otherwise.
Mode parse_mode(std::string_view name);
std::string_view to_string(Mode mode);

// Ranks 0 .. workers-1 are workers, the last `servers` ranks are servers, so
// rank 0 (which logs and writes metrics and checkpoint indexes) is a worker.
struct Roles {
  int workers = 0;
  int servers = 0;
  // Throws ConfigError naming ps.servers unless 1 <= servers < world.
  static Roles for_world(int world_size, int servers);
  bool is_server(int rank) const { return rank >= workers; }
  int server_rank(int server) const { return workers + server; }
  int server_index(int rank) const { return rank - workers; }
};

// Tags of the point-to-point messages on the world group: a message can only
// match the receive posted for its kind, whatever else is in flight.
inline constexpr int kPushTag = 0x50530001;     // worker -> server: [clock, version read] + gradients
inline constexpr int kReplyTag = 0x50530002;    // server -> worker: [version, staleness] + parameters
inline constexpr int kRefreshTag = 0x50530003;  // server -> every rank: parameters only

// Rethrows the CommError / TimeoutError in flight (call it inside a catch)
// as the same type, prefixed with `what` (the role and rank of both ends)
// and followed by `hint` (what the peer's failure probably means), so a dead
// server or worker reads as what it is rather than as a Gloo error.
[[noreturn]] void rethrow_naming(const std::string& what, const std::string& hint);

// Float slots before the payload. Counts travel as float32: exact up to
// 2^24 steps, far more than any run here takes.
inline constexpr int64_t kHeader = 2;

}  // namespace paratrain::param_server
