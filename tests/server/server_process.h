// Test helper: runs the real `moeserve` binary as a child process (the server on an ephemeral
// loopback port, or a one-shot command) and captures its output.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "core/file_util.h"
#include "tests/test_util.h"  // MakeTempDir

#ifndef MOESERVE_BIN
#error "MOESERVE_BIN must name the moeserve binary"
#endif

extern char** environ;

namespace moeserve::testing {

// The file's contents, or "" when it cannot be read (yet).
inline std::string ReadAll(const std::string& path) { return ReadFileToString(path).value_or(""); }

// Spawns argv[0] (a path) with stdout and stderr to files, in this process's environment with
// `env` ("NAME=value") added or replacing; returns the pid or -1.
inline pid_t SpawnProgram(std::vector<std::string> full, const std::string& out_path, const std::string& err_path,
                          std::vector<std::string> env = {}) {
  std::vector<char*> argv;
  for (auto& a : full) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view name(*e, std::strcspn(*e, "="));
    const bool replaced = std::any_of(env.begin(), env.end(), [&](const std::string& mine) {
      return mine.size() > name.size() && mine.compare(0, name.size(), name) == 0 && mine[name.size()] == '=';
    });
    if (!replaced) envp.push_back(*e);
  }
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

// Spawns MOESERVE_BIN with `args` (and `env`, as SpawnProgram).
inline pid_t Spawn(const std::vector<std::string>& args, const std::string& out_path, const std::string& err_path,
                   std::vector<std::string> env = {}) {
  std::vector<std::string> full = {MOESERVE_BIN};
  full.insert(full.end(), args.begin(), args.end());
  return SpawnProgram(std::move(full), out_path, err_path, std::move(env));
}

// Runs a program to completion; returns its exit code (-1 if it could not run).
inline int RunProgram(const std::vector<std::string>& argv, std::string* out, std::string* err = nullptr) {
  const std::string dir = MakeTempDir("cmd");
  const pid_t pid = SpawnProgram(argv, dir + "/out", dir + "/err");
  if (pid < 0) return -1;
  int status = 0;
  waitpid(pid, &status, 0);
  if (out) *out = ReadAll(dir + "/out");
  if (err) *err = ReadAll(dir + "/err");
  std::filesystem::remove_all(dir);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Runs `moeserve ARGS...` to completion; returns its exit code.
inline int RunCommand(const std::vector<std::string>& args, std::string* out, std::string* err = nullptr) {
  std::vector<std::string> full = {MOESERVE_BIN};
  full.insert(full.end(), args.begin(), args.end());
  return RunProgram(full, out, err);
}

// Resident memory of a process, MiB (0 if unreadable).
inline double RssMiB(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atof(line.c_str() + 6) / 1024.0;
  }
  return 0;
}

// The malloc settings under which a server's resident memory follows its live heap, so that a
// soak test's RSS check measures leaks rather than the allocator: two malloc arenas (not one per
// core's worth of gRPC and HTTP threads), and fixed mmap and trim thresholds. glibc otherwise
// raises its mmap threshold after a large free, after which buffers of the tiny preset's size
// (about 12 MiB) come from the heap and stay resident in steps. For ServerProcess::set_env.
inline std::vector<std::string> RssFollowsTheHeapEnv() {
  return {"MALLOC_ARENA_MAX=2", "MALLOC_MMAP_THRESHOLD_=262144", "MALLOC_TRIM_THRESHOLD_=1048576"};
}

// `moeserve serve --listen 127.0.0.1:0 ...` with the bound port read back from --port-file.
class ServerProcess {
 public:
  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // The address the server listens on (before Start; default loopback): another network
  // namespace's, for a server whose rank 0 runs there.
  void set_host(const std::string& host) { host_ = host; }
  // Whether Start adds --http-listen (default yes): off for a test that passes vLLM's
  // --host/--port itself.
  void set_http_listen(bool on) { http_listen_ = on; }
  // Environment variables ("NAME=value") the server gets beside this process's (before Start).
  void set_env(std::vector<std::string> env) { env_ = std::move(env); }

  // Starts the server and waits (up to 60 s) until it listens. False on failure; see log().
  // With a `launcher` (e.g. mpirun and its flags) the server runs under it.
  bool Start(std::vector<std::string> extra_args, std::vector<std::string> launcher = {}) {
    dir_ = MakeTempDir("server");
    std::vector<std::string> args = {"serve", "--listen", host_ + ":0", "--port-file", dir_ + "/port"};
    if (http_listen_) {
      for (std::string a : {std::string("--http-listen"), host_ + ":0", std::string("--http-port-file"),
                            dir_ + "/http_port"}) {
        args.push_back(a);
      }
    }
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    if (launcher.empty()) {
      pid_ = Spawn(args, dir_ + "/out", dir_ + "/err", env_);
    } else {
      launcher.push_back(MOESERVE_BIN);
      launcher.insert(launcher.end(), args.begin(), args.end());
      pid_ = SpawnProgram(launcher, dir_ + "/out", dir_ + "/err", env_);
    }
    if (pid_ < 0) return false;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < give_up) {
      const std::string p = ReadAll(dir_ + "/port");
      if (!p.empty() && p.back() == '\n') {
        port_ = std::stoi(p);
        const std::string hp = ReadAll(dir_ + "/http_port");  // written before the gRPC port file
        http_port_ = hp.empty() ? 0 : std::stoi(hp);
        channel_ = grpc::CreateChannel(target(), grpc::InsecureChannelCredentials());
        return channel_->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10));
      }
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  // Waits up to `seconds` for the exit; returns the exit code (-1 when killed by a signal, -2
  // when still running).
  int WaitExit(double seconds) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (pid_ > 0 && std::chrono::steady_clock::now() < give_up) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -2;
  }

  // Sends `sig` and waits for the exit; returns the exit code (-1 when killed by a signal).
  int Stop(int sig = SIGTERM) {
    if (pid_ <= 0) return -1;
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  pid_t pid() const { return pid_; }
  std::string target() const { return host_ + ":" + std::to_string(port_); }
  int http_port() const { return http_port_; }
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  std::string log() const { return ReadAll(dir_ + "/out") + ReadAll(dir_ + "/err"); }

 private:
  pid_t pid_ = -1;
  std::string host_ = "127.0.0.1";
  bool http_listen_ = true;
  std::vector<std::string> env_;  // set_env's
  int port_ = 0;
  int http_port_ = 0;
  std::string dir_;
  std::shared_ptr<grpc::Channel> channel_;
};

}  // namespace moeserve::testing
