// `serve --help` in groups, as vLLM's `serve --help` groups its flags (model, cache, parallel,
// scheduler, device, frontend, observability), so that a user coming from vLLM finds each
// flag where vLLM keeps it.
#pragma once

#include <CLI/CLI.hpp>

namespace moeserve::tools {

// Assigns every option of `serve` to its group; one not in the table goes to "Other" (a test
// keeps that group empty).
void GroupServeFlags(CLI::App* cmd);

}  // namespace moeserve::tools
