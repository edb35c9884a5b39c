// Process-wide log setup: every line carries the rank so interleaved output
// from many workers stays readable. Code logs through spdlog directly.
#pragma once

#include <string>

namespace paratrain {

// The level names init_logging accepts, in order of verbosity.
inline constexpr const char* kLogLevels[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};

// level: one of kLogLevels. PARATRAIN_LOG_LEVEL, when set, wins over it.
// Throws ConfigError naming the source (`source`, e.g. "--log-level", or
// PARATRAIN_LOG_LEVEL) and the allowed levels for any other word: spdlog
// reads an unknown name as "off", which would silently mute everything.
void init_logging(int rank, const std::string& level = "info", const std::string& source = "log level");

// Throws the same ConfigError when `level` is not a log level; else returns.
void check_log_level(const std::string& level, const std::string& source);

// A status line (a progress bar) kept below the log on stderr: drawn as
// "\r\x1b[K" + text without a newline; each log line first clears it and
// redraws it after itself, so logs and the bar never share a line (as tqdm's
// write() does). `paratrain launch` passes it through on a terminal (see
// launch/line_prefixer.h). Call only when stderr is shown on a terminal.
void set_status_line(const std::string& text);
// Leaves the current status line on screen as an ordinary line (adds the
// newline) and stops redrawing it.
void finish_status_line();

}  // namespace paratrain
