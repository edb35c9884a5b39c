// spdlog default logger with a rank tag, and the check that a level name is real.
#include "paratrain/core/logging.h"

#include <algorithm>
#include <iterator>

#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "paratrain/core/env.h"
#include "paratrain/core/error.h"

namespace paratrain {

void init_logging(int rank, const std::string& level, const std::string& source) {
  const auto from_env = env::get("PARATRAIN_LOG_LEVEL");
  const std::string chosen = from_env ? *from_env : level;
  // Checked before the logger exists: a bad name must fail loudly, not mute.
  check_log_level(chosen, from_env ? std::string("PARATRAIN_LOG_LEVEL") : source);
  auto logger = spdlog::stderr_color_mt(fmt::format("paratrain-{}", rank));
  logger->set_pattern(fmt::format("[%H:%M:%S.%e] [r{}] [%^%l%$] %v", rank));
  logger->set_level(spdlog::level::from_str(chosen == "warn" ? "warning" : chosen));
  spdlog::set_default_logger(logger);
}

void check_log_level(const std::string& level, const std::string& source) {
  if (std::find(std::begin(kLogLevels), std::end(kLogLevels), level) != std::end(kLogLevels)) return;
  throw ConfigError(fmt::format("{} '{}' is not a log level; use one of: {}", source, level,
                                fmt::join(std::begin(kLogLevels), std::end(kLogLevels), ", ")));
}

}  // namespace paratrain
