// One list of op cases (op, shapes, tolerance), as ggml's test-backend-ops: each case makes its
// inputs from a seed, runs the op on a backend (inputs copied to its memory, outputs back) and
// returns the outputs; a test runs every case on every backend the build has (the CPU fast
// path under each kernel variant the machine supports, CUDA where a device is present) and on
// the CPU reference path with the same seed, and compares.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace moeserve::testing {

struct OpCase {
  std::string name;  // the op and its shape
  double atol = 0, rtol = 0;  // |got - want| <= atol + rtol |want|
  // The op's outputs (integers and bf16 bit patterns as doubles) on `backend`, its inputs drawn
  // from `gen`.
  std::function<std::vector<double>(Backend& backend, std::mt19937& gen)> run;
};

std::vector<OpCase> OpCases();

// The cases of op_cases_compute.cc: GEMMs (dense, and grouped over a routing planned by the
// backend), paged attention over either KV dtype, logit edits and sampling.
void AddMatmulCases(std::vector<OpCase>* cases);
void AddAttentionCases(std::vector<OpCase>* cases);
void AddSamplingCases(std::vector<OpCase>* cases);

}  // namespace moeserve::testing
