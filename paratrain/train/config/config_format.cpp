// Writing a TrainConfig out (TOML with a comment per key, JSON) and reading
// the JSON form back (checkpoint metadata). Walks the schema table in
// config_schema.cpp, so a new key is printed and parsed with no code here.
#include <cmath>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/config/config_schema.h"

namespace paratrain::train {
namespace {

using detail::FieldSpec;
using detail::Value;
using detail::ValueType;

std::string format_double(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // {} is the shortest text that reads back to the same double.
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";  // TOML: 25 is an integer, 25.0 a float
  return s;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f) out += fmt::format("\\u{:04X}", c);
        else out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

Value value_from_json(const nlohmann::json& j, const FieldSpec& field) {
  auto wrong = [&] {
    return ConfigError(fmt::format("<json>: {} expects {}, got {}", field.key,
                                   detail::type_name(field.type), j.dump()));
  };
  auto as_int = [&](const nlohmann::json& x) -> int64_t {
    if (!x.is_number_integer()) throw wrong();
    return x.get<int64_t>();
  };
  auto as_double = [&](const nlohmann::json& x) -> double {
    if (!x.is_number()) throw wrong();
    return x.get<double>();
  };
  switch (field.type) {
    case ValueType::Int: return as_int(j);
    case ValueType::Double: return as_double(j);
    case ValueType::Bool:
      if (!j.is_boolean()) throw wrong();
      return j.get<bool>();
    case ValueType::String:
      if (!j.is_string()) throw wrong();
      return j.get<std::string>();
    case ValueType::IntList:
    case ValueType::DoubleList: {
      if (!field.keyword.empty() && j.is_string() && j.get<std::string>() == field.keyword) return field.keyword_value;
      if (!j.is_array()) throw wrong();
      std::vector<int64_t> ints;
      std::vector<double> doubles;
      for (const auto& x : j) {
        if (field.type == ValueType::IntList) ints.push_back(as_int(x));
        else doubles.push_back(as_double(x));
      }
      return field.type == ValueType::IntList ? Value(ints) : Value(doubles);
    }
    case ValueType::StringList: {
      if (!j.is_array()) throw wrong();
      std::vector<std::string> strings;
      for (const auto& x : j) {
        if (!x.is_string()) throw wrong();
        strings.push_back(x.get<std::string>());
      }
      return strings;
    }
  }
  throw wrong();
}

}  // namespace

std::string to_toml(const TrainConfig& config) {
  std::string out =
      "# paratrain training configuration: every key, with its value for this run.\n"
      "# Written by to_toml; load_config reads it back unchanged.\n";
  std::string_view section;
  for (const FieldSpec& f : detail::schema()) {
    if (f.section() != section) {
      section = f.section();
      out += fmt::format("\n[{}]\n", section);
    }
    out += fmt::format("{} = {}  # {}\n", f.name(), detail::format_field_value(f, f.get(config)), f.doc);
  }
  return out + detail::user_to_toml(config.user);
}

nlohmann::json to_json(const TrainConfig& config) {
  nlohmann::json out = nlohmann::json::object();
  for (const FieldSpec& f : detail::schema()) {
    auto& slot = out[std::string(f.section())][std::string(f.name())];
    const Value value = f.get(config);
    if (!f.keyword.empty() && value == f.keyword_value) {
      slot = f.keyword;
      continue;
    }
    std::visit([&](const auto& v) { slot = v; }, value);
  }
  if (!config.user.values().empty()) {
    auto& user = out["user"];
    for (const auto& [key, value] : config.user.values()) std::visit([&](const auto& v) { user[key] = v; }, value);
  }
  return out;
}

TrainConfig config_from_json(const nlohmann::json& json) {
  if (!json.is_object())
    throw ConfigError(fmt::format("<json>: a configuration must be an object of sections, got {}",
                                  json.dump()));
  TrainConfig config;
  for (const auto& [section, keys] : json.items()) {
    if (!keys.is_object()) throw ConfigError("<json>: " + detail::unknown_key(section, true));
    if (section == "user") {
      for (const auto& [name, value] : keys.items()) detail::set_user_from_json(config.user, name, value);
      continue;
    }
    for (const auto& [name, value] : keys.items()) {
      const std::string key = section + "." + name;
      const FieldSpec* field = detail::find_field(key);
      if (!field) throw ConfigError("<json>: " + detail::unknown_key(key, false));
      detail::set_checked(config, *field, value_from_json(value, *field), "<json>");
    }
  }
  validate_config(config);
  return config;
}

namespace detail {

std::string format_field_value(const FieldSpec& field, const Value& value) {
  if (!field.keyword.empty() && value == field.keyword_value) return quote(field.keyword);
  return format_toml_value(value);
}

std::string format_toml_value(const Value& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t>) return fmt::format("{}", v);
        else if constexpr (std::is_same_v<T, double>) return format_double(v);
        else if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
        else if constexpr (std::is_same_v<T, std::string>) return quote(v);
        else if constexpr (std::is_same_v<T, std::vector<int64_t>>)
          return fmt::format("[{}]", fmt::join(v, ", "));
        else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          std::vector<std::string> parts;
          for (const std::string& item : v) parts.push_back(quote(item));
          return fmt::format("[{}]", fmt::join(parts, ", "));
        } else {
          std::vector<std::string> parts;
          for (double d : v) parts.push_back(format_double(d));
          return fmt::format("[{}]", fmt::join(parts, ", "));
        }
      },
      value);
}

}  // namespace detail
}  // namespace paratrain::train
