// The seqforge command-line tool.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "seqforge/seqforge.hpp"

int main(int argc, char** argv) {
  CLI::App app{"seqforge: fast training of LSTM sequence models"};
  app.set_version_flag("--version", std::string("seqforge ") + seqforge::version());
  app.require_subcommand(0, 1);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (app.get_subcommands().empty()) {
    std::fputs(app.help().c_str(), stdout);
  }
  return 0;
}
