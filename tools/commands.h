// Subcommands of the `moeserve` binary. Each Add*Command registers its flags on `app` and
// returns the options struct that the callback fills; Run* executes it.
#pragma once

#include <CLI/CLI.hpp>

#include "engine/model_loader.h"

namespace moeserve::tools {

// Adds --model / --preset / --seed / --dtype to a subcommand.
void AddModelFlags(CLI::App* cmd, ModelSpec* spec, std::string* dtype_flag);
// Applies the parsed --dtype spelling to `spec`.
absl::Status FinishModelSpec(const std::string& dtype_flag, ModelSpec* spec);

// The callback of the chosen command stores its exit status in *exit_code.
void AddMakeModelCommand(CLI::App& app, int* exit_code);
void AddGenerateCommand(CLI::App& app, int* exit_code);

}  // namespace moeserve::tools
