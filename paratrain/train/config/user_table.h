// UserTable: the [user] section of a TrainConfig (config.h), a program's
// own hyper-parameters. Parsing and printing live in config_user.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace paratrain::train {

/// `[user]`: the program's own keys, free-form. paratrain reads none of
/// them; it parses them (`hidden = 64` under [user], `--set user.hidden=64`),
/// saves them with the run (config.toml) and hands them to the program's
/// builders, which read them with get<T>(). Values: integers, floats,
/// booleans, strings, and lists of integers, floats or strings; a dotted name under
/// [user] (`head.width = 8`, or a [user.head] table) is the key "head.width".
class UserTable {
 public:
  /// One value: an integer, float, boolean, string, or list of integers,
  /// floats or strings.
  using Value = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>, std::vector<double>,
                             std::vector<std::string>>;

  /// Sets (or replaces) `key`, e.g. from a program's defaults.
  void set(const std::string& key, Value value) { values_[key] = std::move(value); }
  /// Whether `key` is set.
  bool has(const std::string& key) const { return values_.count(key) > 0; }
  /// The value of `key` as T (an integral type, double, bool, std::string,
  /// std::vector<int64_t>, std::vector<double> or std::vector<std::string>;
  /// an integer reads as a
  /// float too). ConfigError naming the key when it is missing or of another
  /// type.
  template <typename T>
  T get(const std::string& key) const;
  /// The same, `fallback` when the key is missing.
  template <typename T>
  T get(const std::string& key, T fallback) const {
    return has(key) ? get<T>(key) : fallback;
  }
  /// Every key and value, sorted by key.
  const std::map<std::string, Value>& values() const { return values_; }

  /// Equal keys with equal values.
  bool operator==(const UserTable&) const = default;

 private:
  [[noreturn]] void missing_or_mistyped(const std::string& key, const char* wanted) const;
  std::map<std::string, Value> values_;
};

template <typename T>
T UserTable::get(const std::string& key) const {
  auto it = values_.find(key);
  if constexpr (std::is_same_v<T, bool>) {
    if (it != values_.end())
      if (auto* v = std::get_if<bool>(&it->second)) return *v;
    missing_or_mistyped(key, "a boolean");
  } else if constexpr (std::is_integral_v<T>) {
    if (it != values_.end())
      if (auto* v = std::get_if<int64_t>(&it->second)) return static_cast<T>(*v);
    missing_or_mistyped(key, "an integer");
  } else if constexpr (std::is_floating_point_v<T>) {
    if (it != values_.end()) {
      if (auto* v = std::get_if<double>(&it->second)) return static_cast<T>(*v);
      if (auto* i = std::get_if<int64_t>(&it->second)) return static_cast<T>(*i);
    }
    missing_or_mistyped(key, "a number");
  } else if constexpr (std::is_same_v<T, std::vector<double>>) {
    if (it != values_.end()) {
      if (auto* v = std::get_if<std::vector<double>>(&it->second)) return *v;
      if (auto* i = std::get_if<std::vector<int64_t>>(&it->second)) return T(i->begin(), i->end());
    }
    missing_or_mistyped(key, "a list of numbers");
  } else {
    static_assert(std::is_same_v<T, std::string> || std::is_same_v<T, std::vector<int64_t>> ||
                      std::is_same_v<T, std::vector<std::string>>,
                  "UserTable::get<T>: T is an integer type, a floating type, bool, std::string, "
                  "std::vector<int64_t>, std::vector<double> or std::vector<std::string>");
    if (it != values_.end())
      if (auto* v = std::get_if<T>(&it->second)) return *v;
    missing_or_mistyped(key, std::is_same_v<T, std::string>             ? "a string"
                             : std::is_same_v<T, std::vector<int64_t>> ? "a list of integers"
                                                                        : "a list of strings");
  }
}

}  // namespace paratrain::train
