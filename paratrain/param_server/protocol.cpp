// Parameter-server roles and modes: see protocol.h.
#include "paratrain/param_server/protocol.h"

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
