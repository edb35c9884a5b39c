// Reading a TrainConfig: TOML file -> schema walk -> `--set` overrides ->
// validation, with errors that name the source, the full key and the fix.
// Printing (to_toml, to_json) lives in config_format.cpp; the key table in
// config_schema.cpp.
#include "paratrain/train/config/config.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "paratrain/core/error.h"
#include "paratrain/train/config/config_schema.h"

namespace paratrain::train {
namespace {

using detail::FieldSpec;
using detail::Value;
using detail::ValueType;

void apply_table(TrainConfig& config, const toml::table& root, const std::string& source);
void apply_override_from(TrainConfig& config, std::string_view assignment);
std::string unknown_key_message(std::string_view key, bool is_section);
Value value_from_toml(const toml::node& node, const FieldSpec& field, const std::string& where);
ConfigError list_expected(const FieldSpec& field, const std::string& where, const std::string& got);
void check_and_set(TrainConfig& config, const FieldSpec& field, const Value& value,
                   const std::string& where);

}  // namespace

TrainConfig load_config(const std::filesystem::path& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw ConfigError(fmt::format(
        "config file '{}' {} (current directory: {}): pass the path of a TOML file, e.g. "
        "configs/fashion_mnist_mlp.toml",
        path.string(), std::filesystem::exists(path, ec) ? "is not a regular file" : "does not exist",
        std::filesystem::current_path(ec).string()));
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof())
    throw ConfigError(fmt::format("config file '{}' could not be read", path.string()));
  return config_from_toml_string(text.str(), overrides, path.string());
}

TrainConfig config_from_toml_string(std::string_view toml_text, const std::vector<std::string>& overrides,
                                    std::string_view source_name) {
  const std::string source(source_name);
  toml::table root;
  try {
    root = toml::parse(toml_text, source);
  } catch (const toml::parse_error& e) {
    throw ConfigError(fmt::format("{}:{}:{}: not valid TOML: {}", source, e.source().begin.line,
                                  e.source().begin.column, e.description()));
  }
  TrainConfig config;
  apply_table(config, root, source);
  for (const auto& o : overrides) apply_override_from(config, o);
  // Cross-key rules only once every value is in: an override may fix them.
  if (std::string problem = detail::cross_key_problem(config); !problem.empty())
    throw ConfigError(fmt::format("{}{}: {}", source, overrides.empty() ? "" : " with --set overrides",
                                  problem));
  return config;
}

void apply_override(TrainConfig& config, std::string_view assignment) {
  apply_override_from(config, assignment);
}

void validate_config(const TrainConfig& config) {
  for (const auto& f : detail::schema()) {
    const Value v = f.get(config);
    if (std::string rule = f.check(v); !rule.empty())
      throw ConfigError(fmt::format("invalid configuration: {} = {} is not allowed: {}", f.key,
                                    detail::format_field_value(f, v), rule));
  }
  if (std::string problem = detail::cross_key_problem(config); !problem.empty())
    throw ConfigError("invalid configuration: " + problem);
}

std::vector<std::string> config_keys() {
  std::vector<std::string> keys;
  for (const auto& f : detail::schema()) keys.push_back(f.key);
  return keys;
}

namespace detail {
// Shared with config_format.cpp (config_from_json) so both report alike.
void set_checked(TrainConfig& config, const FieldSpec& field, const Value& value, const std::string& where) {
  check_and_set(config, field, value, where);
}
std::string unknown_key(std::string_view key, bool is_section) { return unknown_key_message(key, is_section); }
}  // namespace detail

namespace {

void apply_table(TrainConfig& config, const toml::table& root, const std::string& source) {
  const auto sections = detail::section_names();
  for (const auto& [section_key, node] : root) {
    const std::string section(section_key.str());
    auto where = [&](const toml::node& n) {
      const auto line = n.source().begin.line;
      return line > 0 ? fmt::format("{}:{}", source, line) : source;
    };
    if (section == "user") {
      if (!node.is_table())
        throw ConfigError(fmt::format("{}: 'user' must be a section ([user] followed by the program's own keys), "
                                      "got a value", where(node)));
      auto walk_user = [&](auto&& self, const toml::table& t, const std::string& prefix) -> void {
        for (const auto& [name, value_node] : t) {
          const std::string key = prefix.empty() ? std::string(name.str()) : prefix + "." + std::string(name.str());
          if (value_node.is_table()) self(self, *value_node.as_table(), key);
          else detail::set_user_value(config.user, key, value_node, where(value_node));
        }
      };
      walk_user(walk_user, *node.as_table(), "");
      continue;
    }
    const bool known = std::find(sections.begin(), sections.end(), section) != sections.end();
    if (!known)
      throw ConfigError(fmt::format("{}: {}", where(node), unknown_key_message(section, node.is_table())));
    const toml::table* table = node.as_table();
    if (!table)
      throw ConfigError(fmt::format("{}: '{}' must be a section ([{}] followed by keys), got a value",
                                    where(node), section, section));
    // Keys may have dotted names inside a section (federated.dp.clip is
    // `dp.clip = 1.0` under [federated], or a [federated.dp] table): TOML
    // nests them, so walk sub-tables whose path is not itself a key.
    auto walk = [&](auto&& self, const toml::table& t, const std::string& prefix) -> void {
      for (const auto& [name, value_node] : t) {
        const std::string key = prefix + "." + std::string(name.str());
        const FieldSpec* field = detail::find_field(key);
        if (!field && value_node.is_table()) {
          self(self, *value_node.as_table(), key);
          continue;
        }
        if (!field)
          throw ConfigError(fmt::format("{}: {}", where(value_node), unknown_key_message(key, false)));
        check_and_set(config, *field, value_from_toml(value_node, *field, where(value_node)),
                      where(value_node));
      }
    };
    walk(walk, *table, section);
  }
}

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return "";
  return std::string(s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1));
}

// A list of strings after --set: a TOML array (["fc0", "blocks.0"]), or bare
// words with or without brackets (fc0,blocks.0 or [fc0]). "" and [] are the
// empty list. Bare words keep the shell's quoting out of the way, as a bare
// word for a string key does.
std::vector<std::string> string_list_from_text(const std::string& text, const FieldSpec& field,
                                               const std::string& where) {
  if (text.empty() || text == "\"\"" || text == "[]") return {};
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + text);
    if (parsed.get("v")->is_array()) return std::get<std::vector<std::string>>(value_from_toml(*parsed.get("v"), field, where));
  } catch (const toml::parse_error&) {
    // Bare words: split below.
  }
  std::string_view inner = text;
  if (inner.front() == '[') {
    if (inner.back() != ']') throw ConfigError(fmt::format("{}: {} expects {}, got '{}' (no closing ])", where,
                                                           field.key, detail::type_name(field.type), text));
    inner = inner.substr(1, inner.size() - 2);
  }
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= inner.size()) {
    std::size_t end = inner.find(',', start);
    if (end == std::string_view::npos) end = inner.size();
    std::string item = trim(inner.substr(start, end - start));
    if (item.size() >= 2 && (item.front() == '"' || item.front() == '\'') && item.back() == item.front())
      item = item.substr(1, item.size() - 2);
    if (item.empty())
      throw ConfigError(fmt::format("{}: {} has an empty entry in '{}'; write names separated by commas, e.g. "
                                    "--set {}=fc0,fc1",
                                    where, field.key, text, field.key));
    out.push_back(std::move(item));
    start = end + 1;
  }
  return out;
}

// `key=value`: the value is read as a TOML value and converted to the key's
// type like a file value would be. Two conveniences: a bare word for a string
// key needs no quotes (run.name=exp1), and a list of two or more entries may
// omit brackets (model.hidden=256,128). A lone scalar for a list key is an
// error, as in a file: "model.hidden=256" more likely means a width than a
// one-layer list, so the user writes [256] to say the latter.
void apply_override_from(TrainConfig& config, std::string_view assignment) {
  const std::string where = fmt::format("--set {}", assignment);
  const auto eq = assignment.find('=');
  if (eq == std::string_view::npos)
    throw ConfigError(fmt::format("{}: expected key=value, e.g. optimizer.lr=0.01", where));
  const std::string key = trim(assignment.substr(0, eq));
  std::string text = trim(assignment.substr(eq + 1));
  if (key.rfind("user.", 0) == 0) return detail::set_user_from_text(config.user, key.substr(5), text, where);
  const FieldSpec* field = detail::find_field(key);
  if (!field) throw ConfigError(fmt::format("{}: {}", where, unknown_key_message(key, false)));

  if (!field->keyword.empty() && (text == field->keyword || text == "\"" + field->keyword + "\"")) {
    check_and_set(config, *field, field->keyword_value, where);
    return;
  }
  if (field->type == ValueType::String && (text.empty() || (text[0] != '"' && text[0] != '\''))) {
    check_and_set(config, *field, Value(text), where);
    return;
  }
  if (field->type == ValueType::StringList) {
    check_and_set(config, *field, Value(string_list_from_text(text, *field, where)), where);
    return;
  }
  const bool is_list = detail::is_list_type(field->type);
  if (is_list && (text.empty() || text[0] != '[')) {
    if (!text.empty() && text.find(',') == std::string::npos) throw ConfigError(list_expected(*field, where, "'" + text + "'"));
    text = "[" + text + "]";
  }
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + text);
  } catch (const toml::parse_error&) {
    throw ConfigError(fmt::format("{}: {} expects {}, got '{}'", where, key,
                                  detail::type_name(field->type), text));
  }
  check_and_set(config, *field, value_from_toml(*parsed.get("v"), *field, where), where);
}

// A scalar (or anything else) where a list belongs: show both spellings.
ConfigError list_expected(const FieldSpec& field, const std::string& where, const std::string& got) {
  const bool ints = field.type == ValueType::IntList;
  const bool strings = field.type == ValueType::StringList;
  const std::string syntax =
      where.rfind("--set", 0) == 0
          ? fmt::format("--set {}=[{}] (one entry: --set {}=[{}])", field.key,
                        strings ? "fc0,fc1" : ints ? "256,128" : "0.9,0.999", field.key,
                        strings ? "fc0" : ints ? "256" : "0.9")
          : fmt::format("{} = [{}] under [{}] (one entry: [{}])", field.name(),
                        strings ? "\"fc0\", \"fc1\"" : ints ? "256, 128" : "0.9, 0.999", field.section(),
                        strings ? "\"fc0\"" : ints ? "256" : "0.9");
  return ConfigError(fmt::format("{}: {} expects {}, got {}; write the list in brackets: {}", where, field.key,
                                 detail::type_name(field.type), got, syntax));
}

std::string describe(const toml::node& node) {
  std::ostringstream out;
  if (node.is_integer()) out << "integer " << node.as_integer()->get();
  else if (node.is_floating_point()) out << "float " << *node.as_floating_point();
  else if (node.is_boolean()) out << "boolean " << *node.as_boolean();
  else if (node.is_string()) out << "string " << *node.as_string();
  else if (node.is_array()) out << "array " << *node.as_array();
  else if (node.is_table()) out << "a table";
  else out << "a date/time";
  return out.str();
}

// FieldSpec::table_of_strings: `key = "value"` rows as "key=value" entries,
// a nested table's keys joined with dots (a bare dotted TOML key nests).
template <class Wrong>
std::vector<std::string> strings_of_table(const toml::table& table, const std::string& prefix, const Wrong& wrong) {
  std::vector<std::string> out;
  for (const auto& [name, value] : table) {
    const std::string key = prefix.empty() ? std::string(name.str()) : prefix + "." + std::string(name.str());
    if (const toml::table* inner = value.as_table()) {
      auto nested = strings_of_table(*inner, key, wrong);
      out.insert(out.end(), nested.begin(), nested.end());
    } else if (const auto* text = value.as_string()) {
      out.push_back(key + "=" + text->get());
    } else {
      throw wrong(value);
    }
  }
  return out;
}

Value value_from_toml(const toml::node& node, const FieldSpec& field, const std::string& where) {
  const bool is_list = detail::is_list_type(field.type);
  auto wrong = [&](const toml::node& bad) {
    if (is_list && !bad.is_array()) return list_expected(field, where, describe(bad));
    return ConfigError(fmt::format("{}: {} expects {}, got {}", where, field.key,
                                   detail::type_name(field.type), describe(bad)));
  };
  auto as_int = [&](const toml::node& n) -> int64_t {
    if (!n.is_integer()) throw wrong(node);
    return n.as_integer()->get();
  };
  auto as_double = [&](const toml::node& n) -> double {
    if (n.is_integer()) return static_cast<double>(n.as_integer()->get());
    if (!n.is_floating_point()) throw wrong(node);
    return n.as_floating_point()->get();
  };
  switch (field.type) {
    case ValueType::Int: return as_int(node);
    case ValueType::Double: return as_double(node);
    case ValueType::Bool:
      if (!node.is_boolean()) throw wrong(node);
      return node.as_boolean()->get();
    case ValueType::String:
      if (!node.is_string()) throw wrong(node);
      return node.as_string()->get();
    case ValueType::IntList:
    case ValueType::DoubleList: {
      if (!field.keyword.empty() && node.is_string() && node.as_string()->get() == field.keyword)
        return field.keyword_value;
      const toml::array* array = node.as_array();
      if (!array) throw wrong(node);
      std::vector<int64_t> ints;
      std::vector<double> doubles;
      for (const auto& item : *array) {
        if (field.type == ValueType::IntList) ints.push_back(as_int(item));
        else doubles.push_back(as_double(item));
      }
      return field.type == ValueType::IntList ? Value(ints) : Value(doubles);
    }
    case ValueType::StringList: {
      const toml::array* array = node.as_array();
      if (!array && field.table_of_strings && node.is_table()) return strings_of_table(*node.as_table(), "", wrong);
      if (!array) throw wrong(node);
      std::vector<std::string> strings;
      for (const auto& item : *array) {
        if (!item.is_string()) throw wrong(node);
        strings.push_back(item.as_string()->get());
      }
      return strings;
    }
  }
  throw wrong(node);
}

void check_and_set(TrainConfig& config, const FieldSpec& field, const Value& value, const std::string& where) {
  if (std::string rule = field.check(value); !rule.empty())
    throw ConfigError(fmt::format("{}: {} = {} is not allowed: {}", where, field.key,
                                  detail::format_field_value(field, value), rule));
  field.set(config, value);
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// "unknown key 'optimizer.lrr' (did you mean 'optimizer.lr'?)". A key is
// also matched by its last part alone, so a key put in the wrong section
// ("data.lr") or outside any section ("lr") points at where it belongs.
std::string unknown_key_message(std::string_view key, bool is_section) {
  std::vector<std::string> candidates = is_section ? detail::section_names() : config_keys();
  const std::string_view leaf = key.substr(key.rfind('.') == std::string_view::npos ? 0 : key.rfind('.') + 1);
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const auto& c : candidates) {
    const std::string_view c_leaf = std::string_view(c).substr(c.rfind('.') == std::string::npos ? 0 : c.rfind('.') + 1);
    const size_t d = std::min(edit_distance(key, c), edit_distance(leaf, c_leaf) + (is_section ? 0 : 1));
    if (d < best_distance) best_distance = d, best = c;
  }
  const bool close = best_distance <= std::max<size_t>(2, key.size() / 3);
  std::string message = is_section ? fmt::format("unknown section [{}]", key)
                                   : fmt::format("unknown key '{}'", key);
  if (close) message += fmt::format(" (did you mean '{}'?)", best);
  const std::string_view section = key.substr(0, key.find('.'));
  std::vector<std::string_view> names;
  for (const auto& f : detail::schema())
    if (f.section() == section) names.push_back(f.name());
  if (is_section || names.empty())
    message += fmt::format("; valid sections: {}", fmt::join(detail::section_names(), ", "));
  else
    message += fmt::format("; valid keys in [{}]: {}", section, fmt::join(names, ", "));
  return message;
}

}  // namespace
}  // namespace paratrain::train
