// Typed reads of environment variables, with errors that name the variable.
// Not a config system: train/config/config.h owns user configuration.
#pragma once

#include <optional>
#include <string>

namespace paratrain::env {

std::optional<std::string> get(const char* name);
// Parses an integer; throws ConfigError naming `name` if it is not one.
std::optional<long> get_int(const char* name);
long get_int_or(const char* name, long fallback);
std::string get_or(const char* name, const std::string& fallback);

// Parses an integer in [lo, hi]; nullopt when unset. Throws ConfigError
// with one line naming the variable, its value (shortened when long), the
// range and `what` it is, e.g. "environment variable WORLD_SIZE='4294967298'
// is out of range 1..1048576 (the number of ranks in the job); ...". Never
// wraps: the value is checked before any narrowing to int.
std::optional<int> get_int_in(const char* name, long lo, long hi, const std::string& what);
int get_int_in_or(const char* name, long lo, long hi, const std::string& what, int fallback);

}  // namespace paratrain::env
