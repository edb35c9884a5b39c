// config_reference.h: walks the schema table (config_schema.h) once per
// call; the defaults come from a default-constructed TrainConfig.
#include "paratrain/train/config/config_reference.h"

#include <algorithm>

#include <fmt/format.h>

#include "paratrain/train/config/config_schema.h"

namespace paratrain::train {
namespace {

std::string short_type(detail::ValueType type) {
  switch (type) {
    case detail::ValueType::Int: return "int";
    case detail::ValueType::Double: return "float";
    case detail::ValueType::Bool: return "bool";
    case detail::ValueType::String: return "string";
    case detail::ValueType::IntList: return "list of int";
    case detail::ValueType::DoubleList: return "list of float";
    case detail::ValueType::StringList: return "list of string";
  }
  return "?";
}

std::string section_of(const std::string& key) { return key.substr(0, key.find('.')); }

// A table cell: '|' would end the cell early, and <name> would be read as HTML.
std::string cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += "\\|";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else out += c;
  }
  return out;
}

}  // namespace

std::vector<ConfigKeyInfo> config_reference() {
  const TrainConfig defaults;
  std::vector<ConfigKeyInfo> out;
  for (const auto& f : detail::schema())
    out.push_back({f.key, short_type(f.type), detail::format_field_value(f, f.get(defaults)), f.doc});
  return out;
}

std::string config_reference_text() {
  const auto keys = config_reference();
  size_t key_w = 0, type_w = 0, default_w = 0;
  for (const auto& k : keys) {
    key_w = std::max(key_w, k.key.size());
    type_w = std::max(type_w, k.type.size());
    default_w = std::max(default_w, std::min<size_t>(k.default_value.size(), 24));
  }
  std::string out, section;
  for (const auto& k : keys) {
    if (section_of(k.key) != section) {
      section = section_of(k.key);
      out += fmt::format("{}[{}]\n", out.empty() ? "" : "\n", section);
    }
    out += fmt::format("  {:<{}}  {:<{}}  {:<{}}  {}\n", k.key, key_w, k.type, type_w, k.default_value, default_w,
                       k.doc);
  }
  return out + "\n[user]\n  user.<key>  the program's own keys, free-form (integers, floats, booleans, strings, number "
               "lists); paratrain reads none of them\n";
}

std::string config_reference_markdown() {
  std::string out =
      "# Config reference\n\n"
      "Every key of a `paratrain train` config (TOML), with its type, default and meaning. Generated from the\n"
      "schema (each section's rows in `paratrain/train/config/<group>_section.cpp`) by\n"
      "`paratrain config --list --markdown`; do not edit by hand. Override any key on the command line with\n"
      "`--set section.key=value`.\n";
  std::string section;
  for (const auto& k : config_reference()) {
    if (section_of(k.key) != section) {
      section = section_of(k.key);
      out += fmt::format("\n## [{}]\n\n| key | type | default | meaning |\n|---|---|---|---|\n", section);
    }
    out += fmt::format("| `{}` | {} | `{}` | {} |\n", k.key, k.type, cell(k.default_value), cell(k.doc));
  }
  return out +
         "\n## [user]\n\nFree-form: a program's own hyper-parameters (integers, floats, booleans, strings, lists of "
         "integers or floats), e.g. `hidden = 64`, overridden with `--set user.hidden=128`. paratrain reads none of "
         "them; it saves them with the run (config.toml) and the program's builders read them with "
         "`config.user.get<T>(\"hidden\")` (docs/getting-started.md, \"Your own model and loss in the Trainer\").\n";
}

}  // namespace paratrain::train
