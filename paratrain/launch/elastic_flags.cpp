// Parsing of torchrun's elastic flag values (--nnodes MIN:MAX,
// --rdzv-endpoint HOST:PORT) for the launcher; see launcher.h. Pure string
// handling: what the values mean is decided in launcher.cpp.
#include <cerrno>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/launch/launcher.h"

namespace paratrain::launch {
namespace {

// torchrun's default port for the c10d rendezvous backend.
constexpr int kDefaultRdzvPort = 29400;

// A whole decimal number in [lo, hi], or nullopt ("", "+1", "1x", overflow).
std::optional<int> whole_number(const std::string& text, long lo, long hi) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  errno = 0;
  const long v = std::strtol(text.c_str(), nullptr, 10);
  if (errno != 0 || v < lo || v > hi) return std::nullopt;
  return static_cast<int>(v);
}

}  // namespace

std::pair<int, int> parse_nnodes(const std::string& text) {
  const auto colon = text.find(':');
  const auto min = whole_number(text.substr(0, colon), 1, 1 << 20);
  const auto max = colon == std::string::npos ? min : whole_number(text.substr(colon + 1), 1, 1 << 20);
  if (!min || !max || *max < *min) {
    throw ConfigError(fmt::format("paratrain launch: --nnodes '{}' must be a node count N or a range MIN:MAX "
                                  "with 1 <= MIN <= MAX, e.g. --nnodes 2 or --nnodes 1:4",
                                  text));
  }
  return {*min, *max};
}

std::pair<std::string, int> parse_endpoint(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return ConfigError(fmt::format("paratrain launch: --rdzv-endpoint '{}': {}; give HOST or HOST:PORT, e.g. "
                                   "node0:29400 or [fe80::1]:29400",
                                   text, why));
  };
  std::string host = text;
  std::string port;
  if (!text.empty() && text.front() == '[') {
    // [v6-address] or [v6-address]:port: the brackets keep the address's
    // own colons apart from the port's.
    const auto close = text.find(']');
    if (close == std::string::npos) throw bad("an IPv6 address opened with '[' needs its ']'");
    host = text.substr(1, close - 1);
    const std::string rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') throw bad("only ':PORT' may follow ']'");
      port = rest.substr(1);
      if (port.empty()) throw bad("the port after ':' is missing");
    }
  } else if (const auto colon = text.rfind(':'); colon != std::string::npos) {
    if (text.find(':') != colon) throw bad("an IPv6 address needs brackets: [ADDRESS]:PORT");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (port.empty()) throw bad("the port after ':' is missing");
  }
  if (host.empty()) throw bad("the host is empty");
  if (port.empty()) return {host, kDefaultRdzvPort};
  const auto number = whole_number(port, 1, 65535);
  if (!number) throw bad(fmt::format("port '{}' is not a number in 1..65535", port));
  return {host, *number};
}

}  // namespace paratrain::launch
