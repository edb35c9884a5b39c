// Typed reads of environment variables, with errors that name the variable.
// Not a config system: train/config.h owns user configuration.
#pragma once

#include <optional>
#include <string>

namespace paratrain::env {

std::optional<std::string> get(const char* name);
// Parses an integer; throws ConfigError naming `name` if it is not one.
std::optional<long> get_int(const char* name);
long get_int_or(const char* name, long fallback);
std::string get_or(const char* name, const std::string& fallback);

}  // namespace paratrain::env
