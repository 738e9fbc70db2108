// The moeserve binary: one subcommand per job.
#include <cstdio>

#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{
      "moeserve: a small but real Mixture-of-Experts serving engine.\n"
      "Run `moeserve <command> --help` for the flags of each command."};
  app.require_subcommand(1);
  int exit_code = 0;
  moeserve::tools::AddMakeModelCommand(app, &exit_code);
  moeserve::tools::AddGenerateCommand(app, &exit_code);
  moeserve::tools::AddServeCommand(app, &exit_code);
  moeserve::tools::AddBenchCommand(app, &exit_code);
  moeserve::tools::AddLoadgenCommand(app, &exit_code);
  moeserve::tools::AddRooflineCommand(app, &exit_code);
  moeserve::tools::AddPriceSheetCommand(app, &exit_code);
  moeserve::tools::AddCalibrateCommand(app, &exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
