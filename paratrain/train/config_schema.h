// Internal to train/config*.cpp: the schema table behind TrainConfig — one
// FieldSpec per key with its type, doc line, accessors and range check.
// Not a public header; include config.h.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>
#include <toml++/toml.h>

#include "paratrain/train/config.h"

namespace paratrain::train::detail {

enum class ValueType { Int, Double, Bool, String, IntList, DoubleList };

// One key's value, whatever its type: what parsers produce and printers read.
// (The same variant as a [user] value.)
using Value = UserTable::Value;

struct FieldSpec {
  std::string key;  // "optimizer.lr": section, dot, name
  ValueType type;
  std::string doc;  // one line, written above the key by to_toml
  std::function<Value(const TrainConfig&)> get;
  std::function<void(TrainConfig&, const Value&)> set;
  // Empty when the value is allowed; else what is allowed ("must be > 0").
  std::function<std::string(const Value&)> check;

  std::string_view section() const { return std::string_view(key).substr(0, key.find('.')); }
  std::string_view name() const { return std::string_view(key).substr(key.find('.') + 1); }
};

// Every key, grouped by section in the order sections appear in TrainConfig.
const std::vector<FieldSpec>& schema();
const FieldSpec* find_field(std::string_view key);
std::vector<std::string> section_names();

// Rules that involve more than one key (nesterov needs momentum, ...).
// Returns the first problem found, or "" when the config is consistent.
std::string cross_key_problem(const TrainConfig& config);

// Checks `value` against the field's rule and stores it, or throws
// ConfigError "<where>: <key> = <value> is not allowed: <rule>" (config.cpp).
void set_checked(TrainConfig& config, const FieldSpec& field, const Value& value,
                 const std::string& where);
// "unknown key 'x.y' (did you mean ...?); valid keys in [x]: ..." (config.cpp).
std::string unknown_key(std::string_view key, bool is_section);

// [user] (config_user.cpp): a value of any supported type, inferred from a
// TOML node, from `--set user.KEY=TEXT`, or from JSON; ConfigError otherwise.
void set_user_value(UserTable& user, const std::string& key, const toml::node& node, const std::string& where);
void set_user_from_text(UserTable& user, const std::string& key, const std::string& text, const std::string& where);
void set_user_from_json(UserTable& user, const std::string& key, const nlohmann::json& json);
// "[user]\nkey = value\n..." (empty when there are no keys).
std::string user_to_toml(const UserTable& user);

std::string_view type_name(ValueType type);  // "an integer", "a list of floats", ...
std::string format_toml_value(const Value& value);

}  // namespace paratrain::train::detail
