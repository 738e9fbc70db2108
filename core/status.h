// Error-handling helpers: absl::Status propagation macros and CHECK for invariants.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MS_CONCAT_INNER(a, b) a##b
#define MS_CONCAT(a, b) MS_CONCAT_INNER(a, b)

// Returns from the enclosing function when `expr` yields a non-OK status.
#define RETURN_IF_ERROR(expr)                     \
  do {                                            \
    ::absl::Status _ms_status = (expr);           \
    if (!_ms_status.ok()) return _ms_status;      \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, MakeX());` unwraps a StatusOr or returns its error.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  ASSIGN_OR_RETURN_IMPL(MS_CONCAT(_ms_statusor_, __LINE__), lhs, rexpr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                          \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()

// Invariant check: a failure is a bug in moeserve, never bad user input.
#define MS_CHECK(cond)                                                               \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "CHECK failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                  \
    }                                                                                \
  } while (0)

#define MS_CHECK_OK(expr)                                                          \
  do {                                                                             \
    ::absl::Status _ms_s = (expr);                                                 \
    if (!_ms_s.ok()) {                                                             \
      std::fprintf(stderr, "CHECK_OK failed at %s:%d: %s\n", __FILE__, __LINE__,   \
                   std::string(_ms_s.ToString()).c_str());                         \
      std::abort();                                                                \
    }                                                                              \
  } while (0)
