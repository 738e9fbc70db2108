// This binary under mpirun (see mpirun_self.h).
#include "tools/mpirun_self.h"

#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_cat.h"

namespace moeserve::tools {

absl::StatusOr<MpirunOutput> RunSelfUnderMpirun(int np, const std::string& mpirun_args, const std::string& args) {
#ifdef MOESERVE_MPIEXEC
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) return absl::InternalError("cannot find this program's own executable (/proc/self/exe)");
  self[len] = '\0';
  const std::string cmd = absl::StrCat(MOESERVE_MPIEXEC, " --oversubscribe", geteuid() == 0 ? " --allow-run-as-root" : "",
                                       " ", mpirun_args, " -np ", np, " '", self, "' ", args, " 2>&1");
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return absl::UnavailableError(absl::StrCat("cannot run ", cmd));
  MpirunOutput out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) out.output.append(buf, n);
  out.status = pclose(pipe);
  return out;
#else
  (void)np, (void)mpirun_args, (void)args;
  return absl::UnimplementedError("this moeserve was built without MPI");
#endif
}

}  // namespace moeserve::tools
