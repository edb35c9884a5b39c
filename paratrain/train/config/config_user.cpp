// The [user] table (config.h, UserTable): free-form keys whose type comes
// from the value itself, since no schema knows them.
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "paratrain/core/error.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/config/config_schema.h"

namespace paratrain::train {

void UserTable::missing_or_mistyped(const std::string& key, const char* wanted) const {
  auto it = values_.find(key);
  if (it == values_.end()) {
    std::vector<std::string> keys;
    for (const auto& [k, v] : values_) keys.push_back(k);
    throw ConfigError(fmt::format("user.{} is not set: add `{} = ...` under [user] in the config, or pass --set "
                                  "user.{}=VALUE{}",
                                  key, key, key,
                                  keys.empty() ? std::string(" (the [user] table is empty)")
                                               : fmt::format(" (set under [user]: {})", fmt::join(keys, ", "))));
  }
  throw ConfigError(fmt::format("user.{} = {} is not {}", key, detail::format_toml_value(it->second), wanted));
}

namespace detail {
namespace {

ConfigError unsupported(const std::string& key, const std::string& where, const std::string& what) {
  return ConfigError(fmt::format("{}: user.{} = {}: [user] values are integers, floats, booleans, strings, or "
                                 "lists of integers, floats or strings",
                                 where, key, what));
}

}  // namespace

void set_user_value(UserTable& user, const std::string& key, const toml::node& node, const std::string& where) {
  if (auto* i = node.as_integer()) return user.set(key, i->get());
  if (auto* d = node.as_floating_point()) return user.set(key, d->get());
  if (auto* b = node.as_boolean()) return user.set(key, b->get());
  if (auto* s = node.as_string()) return user.set(key, s->get());
  if (auto* a = node.as_array()) {
    if (!a->empty() && a->front().is_string()) {
      std::vector<std::string> strings;
      for (const auto& item : *a) {
        if (!item.is_string()) throw unsupported(key, where, "a list that mixes strings and other values");
        strings.push_back(item.as_string()->get());
      }
      return user.set(key, strings);
    }
    std::vector<int64_t> ints;
    std::vector<double> doubles;
    bool any_float = false;
    for (const auto& item : *a) {
      if (auto* i = item.as_integer()) {
        ints.push_back(i->get());
        doubles.push_back(static_cast<double>(i->get()));
      } else if (auto* d = item.as_floating_point()) {
        any_float = true;
        doubles.push_back(d->get());
      } else {
        throw unsupported(key, where, "a list with a non-number");
      }
    }
    return any_float ? user.set(key, doubles) : user.set(key, ints);
  }
  throw unsupported(key, where, node.is_table() ? "a table" : "a date or time");
}

void set_user_from_text(UserTable& user, const std::string& key, const std::string& text, const std::string& where) {
  if (key.empty()) throw ConfigError(fmt::format("{}: user.KEY=VALUE needs a key after 'user.'", where));
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + text);
  } catch (const toml::parse_error&) {
    // A bare word is a string, as for the schema's string keys (run.name=exp1).
    return user.set(key, text);
  }
  set_user_value(user, key, *parsed.get("v"), where);
}

void set_user_from_json(UserTable& user, const std::string& key, const nlohmann::json& j) {
  if (j.is_boolean()) return user.set(key, j.get<bool>());
  if (j.is_number_integer()) return user.set(key, j.get<int64_t>());
  if (j.is_number()) return user.set(key, j.get<double>());
  if (j.is_string()) return user.set(key, j.get<std::string>());
  if (j.is_array()) {
    if (!j.empty() && j.front().is_string()) {
      for (const auto& x : j)
        if (!x.is_string()) throw unsupported(key, "<json>", j.dump());
      return user.set(key, j.get<std::vector<std::string>>());
    }
    bool ints = true;
    for (const auto& x : j) {
      if (!x.is_number()) throw unsupported(key, "<json>", j.dump());
      ints = ints && x.is_number_integer();
    }
    if (ints) return user.set(key, j.get<std::vector<int64_t>>());
    return user.set(key, j.get<std::vector<double>>());
  }
  throw unsupported(key, "<json>", j.dump());
}

std::string user_to_toml(const UserTable& user) {
  if (user.values().empty()) return "";
  std::string out = "\n[user]  # the program's own keys (read by its builders, not by paratrain)\n";
  for (const auto& [key, value] : user.values()) {
    const bool bare = !key.empty() && key.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                            "0123456789_-.") == std::string::npos &&
                      key.front() != '.' && key.back() != '.' && key.find("..") == std::string::npos;
    // A dotted bare key nests ([user] head.width = 8), which reads back as
    // the same "head.width"; anything else is quoted.
    out += fmt::format("{} = {}\n", bare ? key : format_toml_value(std::string(key)), format_toml_value(value));
  }
  return out;
}

}  // namespace detail
}  // namespace paratrain::train
