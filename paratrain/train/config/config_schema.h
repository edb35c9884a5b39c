// Internal to train/config/*.cpp: the schema table behind TrainConfig — one
// FieldSpec per key with its type, doc line, accessors and range check.
// Not a public header; include config.h.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>
#include <toml++/toml.h>

#include "paratrain/train/config/config.h"

namespace paratrain::train::detail {

enum class ValueType { Int, Double, Bool, String, IntList, DoubleList, StringList };

// Whether values of `type` are lists ([a, b] in TOML).
inline bool is_list_type(ValueType type) {
  return type == ValueType::IntList || type == ValueType::DoubleList || type == ValueType::StringList;
}

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
  // A list key that also takes one word for a special value: profile.ranks
  // = "all" is [] (every entry), data.batch_shares = "auto" is a list no
  // user can write. Read in a file, --set and JSON; written back as the word.
  std::string keyword;
  Value keyword_value;
  // A string list that a file may also write as a table of strings:
  // [parallel.tp_plan] with `"blocks.*.fc" = "colwise"` is the entry
  // "blocks.*.fc=colwise" (a nested table's keys joined with dots).
  bool table_of_strings = false;

  std::string_view section() const { return std::string_view(key).substr(0, key.find('.')); }
  std::string_view name() const { return std::string_view(key).substr(key.find('.') + 1); }
};

template <class T>
constexpr ValueType value_type_of() {
  if constexpr (std::is_same_v<T, int64_t>) return ValueType::Int;
  else if constexpr (std::is_same_v<T, double>) return ValueType::Double;
  else if constexpr (std::is_same_v<T, bool>) return ValueType::Bool;
  else if constexpr (std::is_same_v<T, std::string>) return ValueType::String;
  else if constexpr (std::is_same_v<T, std::vector<int64_t>>) return ValueType::IntList;
  else if constexpr (std::is_same_v<T, std::vector<std::string>>) return ValueType::StringList;
  else {
    static_assert(std::is_same_v<T, std::vector<double>>, "unsupported config field type");
    return ValueType::DoubleList;
  }
}

// A check on one value: "" when allowed, else the rule it broke (config_ranges.h).
template <class T>
using Check = std::function<std::string(const T&)>;

// One schema row from pointers to the section and to the member in it.
template <class S, class T>
FieldSpec field(std::string key, S TrainConfig::*section, T S::*member, std::string doc, Check<T> check = {}) {
  FieldSpec f;
  f.key = std::move(key);
  f.type = value_type_of<T>();
  f.doc = std::move(doc);
  f.get = [section, member](const TrainConfig& c) { return Value((c.*section).*member); };
  f.set = [section, member](TrainConfig& c, const Value& v) { (c.*section).*member = std::get<T>(v); };
  f.check = [check](const Value& v) { return check ? check(std::get<T>(v)) : std::string(); };
  return f;
}

// A row for a member of a component's options struct that the section holds
// (precision.init_scale is PrecisionConfig::scaler.init_scale): the key stays
// flat in the file, the default is the component's.
template <class S, class O, class T>
FieldSpec field(std::string key, S TrainConfig::*section, O S::*options, T O::*member, std::string doc,
                Check<T> check = {}) {
  FieldSpec f;
  f.key = std::move(key);
  f.type = value_type_of<T>();
  f.doc = std::move(doc);
  f.get = [section, options, member](const TrainConfig& c) { return Value((c.*section).*options.*member); };
  f.set = [section, options, member](TrainConfig& c, const Value& v) {
    (c.*section).*options.*member = std::get<T>(v);
  };
  f.check = [check](const Value& v) { return check ? check(std::get<T>(v)) : std::string(); };
  return f;
}

// The row `f`, also readable as a table of strings (FieldSpec::table_of_strings).
inline FieldSpec table_of_strings(FieldSpec f) {
  f.table_of_strings = true;
  return f;
}

// Each section's rows, beside its struct in <group>_section.cpp, in the order
// of TrainConfig's members.
std::vector<FieldSpec> run_fields();
std::vector<FieldSpec> model_fields();
std::vector<FieldSpec> optimizer_fields();
std::vector<FieldSpec> lr_fields();
std::vector<FieldSpec> data_fields();
std::vector<FieldSpec> train_fields();
std::vector<FieldSpec> log_fields();
std::vector<FieldSpec> world_fields();
std::vector<FieldSpec> elastic_fields();
std::vector<FieldSpec> ddp_fields();
std::vector<FieldSpec> parallel_fields();
std::vector<FieldSpec> zero_fields();
std::vector<FieldSpec> pipeline_fields();
std::vector<FieldSpec> precision_fields();
std::vector<FieldSpec> ps_fields();
std::vector<FieldSpec> federated_fields();
std::vector<FieldSpec> profile_fields();
std::vector<FieldSpec> freeze_fields();
std::vector<FieldSpec> distill_fields();
std::vector<FieldSpec> quant_fields();

// Each group's cross-key rules, beside its sections: "" when consistent, else
// the first rule broken, naming the keys and what to set.
std::string run_problem(const TrainConfig& config);
std::string model_problem(const TrainConfig& config);
std::string optim_problem(const TrainConfig& config);
std::string world_problem(const TrainConfig& config);
std::string parallel_problem(const TrainConfig& config);
std::string ps_problem(const TrainConfig& config);
std::string federated_problem(const TrainConfig& config);
std::string profile_problem(const TrainConfig& config);
std::string freeze_problem(const TrainConfig& config);
std::string distill_problem(const TrainConfig& config);
std::string quant_problem(const TrainConfig& config);

// Every key, grouped by section in the order sections appear in TrainConfig.
const std::vector<FieldSpec>& schema();
const FieldSpec* find_field(std::string_view key);
std::vector<std::string> section_names();

// Rules that involve more than one key (nesterov needs momentum, ...): each
// group's *_problem in turn. Returns the first problem found, or "" when the
// config is consistent.
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
// The field's value as written in a file: its keyword for keyword_value.
std::string format_field_value(const FieldSpec& field, const Value& value);

}  // namespace paratrain::train::detail
