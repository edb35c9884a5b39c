// `paratrain config --list [--markdown]`: every config key with its type,
// default and meaning (the source of docs/config-reference.md).
#include <cstdio>
#include <memory>

#include <CLI/CLI.hpp>

#include "apps/paratrain/commands.h"
#include "paratrain/train/config/config_reference.h"

namespace paratrain::cli {

Command add_config_command(CLI::App& app) {
  struct Args {
    bool list = false;
    bool markdown = false;
  };
  auto args = std::make_shared<Args>();
  auto* sub = app.add_subcommand("config", "Describe the config keys of `paratrain train`");
  sub->add_flag("--list", args->list, "Print every key with its type, default and meaning")->required();
  sub->add_flag("--markdown", args->markdown, "As Markdown tables (docs/config-reference.md)");
  auto run = [args]() -> int {
    const auto text = args->markdown ? train::config_reference_markdown() : train::config_reference_text();
    std::fputs(text.c_str(), stdout);
    return 0;
  };
  return {sub, run};
}

}  // namespace paratrain::cli
