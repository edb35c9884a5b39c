// Parameter-server roles and modes: see protocol.h.
#include "paratrain/param_server/protocol.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::param_server {

Mode parse_mode(std::string_view name) {
  if (name == "sync") return Mode::kSync;
  if (name == "async") return Mode::kAsync;
  if (name == "ssp") return Mode::kSsp;
  throw ConfigError(fmt::format("ps.mode = \"{}\": use \"sync\", \"async\" or \"ssp\"", name));
}

std::string_view to_string(Mode mode) {
  switch (mode) {
    case Mode::kSync: return "sync";
    case Mode::kAsync: return "async";
    case Mode::kSsp: return "ssp";
  }
  return "?";
}

void rethrow_naming(const std::string& what, const std::string& hint) {
  try {
    throw;
  } catch (const TimeoutError& e) {
    throw TimeoutError(fmt::format("{}: {}; {}", what, e.what(), hint));
  } catch (const CommError& e) {
    throw CommError(fmt::format("{}: {}; {}", what, e.what(), hint));
  }
}

int push_tag(int64_t bucket_index) {
  TORCH_CHECK(bucket_index >= 0 && bucket_index < kMaxRangesPerServer, "push_tag: bucket ", bucket_index,
              " of a server; at most ", kMaxRangesPerServer, " per server");
  return 0x50540000 + static_cast<int>(bucket_index);
}

int reply_tag(int64_t bucket_index) {
  TORCH_CHECK(bucket_index >= 0 && bucket_index < kMaxRangesPerServer, "reply_tag: bucket ", bucket_index,
              " of a server; at most ", kMaxRangesPerServer, " per server");
  return 0x50550000 + static_cast<int>(bucket_index);
}

PushDtype parse_push_dtype(std::string_view name) {
  if (name == "fp32") return PushDtype::kFp32;
  if (name == "fp16") return PushDtype::kFp16;
  throw ConfigError(fmt::format("ps.push_dtype = \"{}\": use \"fp32\" or \"fp16\"", name));
}

int64_t push_message_numel(int64_t numel, PushDtype dtype) {
  return kHeader + (dtype == PushDtype::kFp16 ? (numel + 1) / 2 : numel);
}

at::Tensor encode_push(int64_t clock, int64_t read, const at::Tensor& grad, PushDtype dtype, bool last) {
  const int64_t n = grad.numel();
  auto message = torch::empty({push_message_numel(n, dtype)}, torch::kFloat);
  message[0] = static_cast<float>(clock);
  message[1] = static_cast<float>(read);
  message[2] = last ? 1.0f : 0.0f;
  auto flat = grad.detach().reshape(-1);
  if (dtype == PushDtype::kFp32) {
    message.slice(0, kHeader).copy_(flat);
  } else {
    // Reinterpret the float32 payload slots as 2x as many halves.
    auto halves = message.slice(0, kHeader).view(at::kHalf);
    halves.slice(0, 0, n).copy_(flat);  // rounds to nearest fp16
    if (halves.numel() > n) halves.slice(0, n).zero_();
  }
  return message;
}

at::Tensor decode_push(const at::Tensor& message, int64_t numel, PushDtype dtype) {
  TORCH_CHECK(message.numel() == push_message_numel(numel, dtype), "decode_push: a message of ", message.numel(),
              " floats for ", numel, " values");
  auto payload = message.slice(0, kHeader);
  if (dtype == PushDtype::kFp32) return payload;
  return payload.view(at::kHalf).slice(0, 0, numel).to(at::kFloat);
}

Roles Roles::for_world(int world_size, int servers) {
  if (servers < 1 || servers >= world_size) {
    throw ConfigError(fmt::format("ps.servers = {} with {} ranks: the servers are the last ps.servers ranks and at "
                                  "least one rank must be a worker; set ps.servers between 1 and {} or start "
                                  "more ranks",
                                  servers, world_size, world_size - 1));
  }
  return {world_size - servers, servers};
}

}  // namespace paratrain::param_server
