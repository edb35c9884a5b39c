// Environment variable parsing with clear errors.
#include "paratrain/core/env.h"

#include <cerrno>
#include <climits>
#include <cstdlib>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::env {
namespace {

// A value as an error line quotes it: whatever its length, the line stays short.
std::string shown_value(const std::string& value) {
  constexpr std::size_t kShown = 40;
  if (value.size() <= kShown) return "'" + value + "'";
  return fmt::format("'{}...' ({} characters)", value.substr(0, kShown), value.size());
}

}  // namespace

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
  if (end == s->c_str() || *end != '\0') {
    throw ConfigError(fmt::format(
        "environment variable {}={} is not an integer; unset it or set a whole number", name, shown_value(*s)));
  }
  if (errno == ERANGE) {
    throw ConfigError(fmt::format("environment variable {}={} is too large for an integer; unset it or set a "
                                  "smaller whole number",
                                  name, shown_value(*s)));
  }
  return v;
}

long get_int_or(const char* name, long fallback) { return get_int(name).value_or(fallback); }

std::string get_or(const char* name, const std::string& fallback) {
  return get(name).value_or(fallback);
}

std::optional<int> get_int_in(const char* name, long lo, long hi, const std::string& what) {
  const auto s = get(name);
  if (!s) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(s->c_str(), &end, 10);
  if (end == s->c_str() || *end != '\0') {
    throw ConfigError(fmt::format("environment variable {}={} is not an integer: it must be a whole number in "
                                  "{}..{} ({}); unset it or fix it",
                                  name, shown_value(*s), lo, hi, what));
  }
  // ERANGE: beyond long itself, so beyond [lo, hi] too.
  if (errno == ERANGE || v < lo || v > hi || v < INT_MIN || v > INT_MAX) {
    throw ConfigError(fmt::format("environment variable {}={} is out of range {}..{} ({}); unset it or fix it",
                                  name, shown_value(*s), lo, hi, what));
  }
  return static_cast<int>(v);
}

int get_int_in_or(const char* name, long lo, long hi, const std::string& what, int fallback) {
  return get_int_in(name, lo, hi, what).value_or(fallback);
}

}  // namespace paratrain::env
