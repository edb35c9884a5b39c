// The parameter-server wire protocol and roles: which ranks are servers,
// the three consistency modes, and the messages between workers and servers
// (float32 tensors, a small header followed by the payload: one message per
// bucket of a server's key ranges each way, so a worker can use the first
// parameters that arrive). Not the partitioning (key_ranges.h,
// bucket_plan.h), not the loops (server.h, worker.h).
#pragma once

#include <ATen/core/Tensor.h>

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
inline constexpr int kRefreshTag = 0x50530003;  // server -> every rank: parameters only
// A push is one message per bucket of the server's key ranges (BucketPlan,
// Note [Parameter-server buckets] in bucket_plan.h), [clock, version read,
// last] + the bucket's ranges' gradients back to back, each bucket on its
// own tag so buckets can leave in whatever order backward makes them ready.
inline constexpr int kMaxRangesPerServer = 1 << 16;  // and so buckets
int push_tag(int64_t bucket_index);
// A reply is one message per bucket too, [version, staleness, item] + the
// bucket's ranges' parameters, each on its own tag: a worker waits for the
// bucket holding a layer's ranges just before that layer's forward runs
// (Note [Pulling during the forward] in ps_strategy.cpp). Every bucket of
// one reply carries the same header.
int reply_tag(int64_t bucket_index);

// Wire dtype of gradient pushes (ps.push_dtype). Replies and refreshes are
// always fp32: they carry the parameters themselves.
enum class PushDtype { kFp32, kFp16 };
// "fp32" | "fp16"; throws ConfigError naming ps.push_dtype otherwise.
PushDtype parse_push_dtype(std::string_view name);

// Rethrows the CommError / TimeoutError in flight (call it inside a catch)
// as the same type, prefixed with `what` (the role and rank of both ends)
// and followed by `hint` (what the peer's failure probably means), so a dead
// server or worker reads as what it is rather than as a Gloo error.
[[noreturn]] void rethrow_naming(const std::string& what, const std::string& hint);

// Float slots before the payload. Counts travel as float32: exact up to
// 2^24 steps or batches, far more than any run here takes. A push's third
// slot is 1 on a worker's last push of a dynamic-batch window, a reply's the
// batch item server 0 hands to that worker next (-1: none); see Note
// [Dynamic batches] in server.h.
inline constexpr int64_t kHeader = 3;

// One push message: float32 [clock, read, last] followed by `grad` (any
// shape, flattened) in `dtype`. fp16 values are packed two to a float32 slot
// (padded to an even count), so every message stays a float32 tensor of
// push_message_numel(grad.numel(), dtype) elements.
at::Tensor encode_push(int64_t clock, int64_t read, const at::Tensor& grad, PushDtype dtype, bool last = false);
int64_t push_message_numel(int64_t numel, PushDtype dtype);
// The `numel` gradient values of a push message, as float32.
at::Tensor decode_push(const at::Tensor& message, int64_t numel, PushDtype dtype);

}  // namespace paratrain::param_server
