// Environment variable parsing with clear errors.
#include "paratrain/core/env.h"

#include <cerrno>
#include <cstdlib>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::env {

std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

std::optional<long> get_int(const char* name) {
  auto s = get(name);
  if (!s) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(s->c_str(), &end, 10);
  if (errno != 0 || end == s->c_str() || *end != '\0') {
    throw ConfigError(fmt::format(
        "environment variable {}='{}' is not an integer; unset it or set a whole number", name, *s));
  }
  return v;
}

long get_int_or(const char* name, long fallback) { return get_int(name).value_or(fallback); }

std::string get_or(const char* name, const std::string& fallback) {
  return get(name).value_or(fallback);
}

}  // namespace paratrain::env
