// spdlog default logger with a rank tag, and the check that a level name is real.
#include "paratrain/core/logging.h"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <mutex>

#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "paratrain/core/env.h"
#include "paratrain/core/error.h"

namespace paratrain {

namespace {

// The status line and the lock that orders it with log lines: every write
// to stderr made through the logger or the status functions holds it.
struct StatusLine {
  std::mutex mutex;
  std::string text;  // empty: none shown
};
StatusLine& status() {
  static StatusLine s;
  return s;
}
void clear_line() { std::fputs("\r\x1b[K", stderr); }

// Wraps the colour sink: clear the status line, log, redraw it.
class StatusAwareSink : public spdlog::sinks::sink {
 public:
  StatusAwareSink() : inner_(std::make_shared<spdlog::sinks::stderr_color_sink_st>()) {}
  void log(const spdlog::details::log_msg& msg) override {
    auto& st = status();
    std::lock_guard<std::mutex> lock(st.mutex);
    if (!st.text.empty()) clear_line();
    inner_->log(msg);
    if (!st.text.empty()) std::fputs(st.text.c_str(), stderr);
    std::fflush(stderr);
  }
  void flush() override {
    std::lock_guard<std::mutex> lock(status().mutex);
    inner_->flush();
  }
  void set_pattern(const std::string& pattern) override { inner_->set_pattern(pattern); }
  void set_formatter(std::unique_ptr<spdlog::formatter> formatter) override {
    inner_->set_formatter(std::move(formatter));
  }

 private:
  std::shared_ptr<spdlog::sinks::stderr_color_sink_st> inner_;
};

}  // namespace

void set_status_line(const std::string& text) {
  auto& st = status();
  std::lock_guard<std::mutex> lock(st.mutex);
  st.text = text;
  clear_line();
  std::fputs(text.c_str(), stderr);
  std::fflush(stderr);
}

void finish_status_line() {
  auto& st = status();
  std::lock_guard<std::mutex> lock(st.mutex);
  if (st.text.empty()) return;
  std::fputs("\n", stderr);
  std::fflush(stderr);
  st.text.clear();
}

void init_logging(int rank, const std::string& level, const std::string& source) {
  const auto from_env = env::get("PARATRAIN_LOG_LEVEL");
  const std::string chosen = from_env ? *from_env : level;
  // Checked before the logger exists: a bad name must fail loudly, not mute.
  check_log_level(chosen, from_env ? std::string("PARATRAIN_LOG_LEVEL") : source);
  auto logger = std::make_shared<spdlog::logger>(fmt::format("paratrain-{}", rank), std::make_shared<StatusAwareSink>());
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
