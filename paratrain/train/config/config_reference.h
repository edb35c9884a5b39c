// The config reference: every TrainConfig key with its type, default and
// meaning, read from the schema table, for `paratrain config --list` and the
// generated docs/config-reference.md. Not a parser: see config.h.
#pragma once

#include <string>
#include <vector>

namespace paratrain::train {

struct ConfigKeyInfo {
  std::string key;            // "optimizer.lr"
  std::string type;           // "int", "float", "bool", "string", "list of int", "list of float"
  std::string default_value;  // as TOML: 0.05, "sgd", [256, 128]
  std::string doc;            // the schema's one-line meaning
};

// Every key in schema order, with TrainConfig{}'s defaults.
std::vector<ConfigKeyInfo> config_reference();

// For a terminal: one block per section, one line per key.
std::string config_reference_text();
// docs/config-reference.md: one table per section.
std::string config_reference_markdown();

}  // namespace paratrain::train
