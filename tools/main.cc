// The moeserve binary: one subcommand per job.
#include <cstdio>
#include <string>

#include "tools/commands.h"
#include "tools/vllm_flags.h"

int main(int argc, char** argv) {
  CLI::App app{
      "moeserve: a small but real Mixture-of-Experts serving engine.\n"
      "Run `moeserve <command> --help` for the flags of each command."};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("moeserve ") + MOESERVE_VERSION);
  int exit_code = 0;
  moeserve::tools::AddMakeModelCommand(app, &exit_code);
  moeserve::tools::AddGenerateCommand(app, &exit_code);
  moeserve::tools::AddServeCommand(app, &exit_code);
  moeserve::tools::AddBenchCommand(app, &exit_code);
  moeserve::tools::AddLoadgenCommand(app, &exit_code);
  moeserve::tools::AddRooflineCommand(app, &exit_code);
  moeserve::tools::AddPriceSheetCommand(app, &exit_code);
  moeserve::tools::AddCalibrateCommand(app, &exit_code);
  moeserve::tools::AddExploreCommand(app, &exit_code);
  // vLLM's -tp and -pp, spelled long (tools/vllm_flags.h).
  std::vector<std::string> args = moeserve::tools::ExpandVllmShortFlags(argc, argv);
  std::vector<char*> ptrs;
  for (std::string& a : args) ptrs.push_back(a.data());
  CLI11_PARSE(app, static_cast<int>(ptrs.size()), ptrs.data());
  return exit_code;
}
