// Process-wide log setup: every line carries the rank so interleaved output
// from many workers stays readable. Code logs through spdlog directly.
#pragma once

#include <string>

namespace paratrain {

// level: trace, debug, info, warn, error. Also honours PARATRAIN_LOG_LEVEL.
void init_logging(int rank, const std::string& level = "info");

}  // namespace paratrain
