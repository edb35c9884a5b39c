// spdlog default logger with a rank tag.
#include "paratrain/core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "paratrain/core/env.h"

namespace paratrain {

void init_logging(int rank, const std::string& level) {
  auto logger = spdlog::stderr_color_mt(fmt::format("paratrain-{}", rank));
  logger->set_pattern(fmt::format("[%H:%M:%S.%e] [r{}] [%^%l%$] %v", rank));
  logger->set_level(spdlog::level::from_str(env::get_or("PARATRAIN_LOG_LEVEL", level)));
  spdlog::set_default_logger(logger);
}

}  // namespace paratrain
