// Which process listens on a TCP port, from /proc: for the error a second server gets when its
// port is taken.
#include <dirent.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/http_server.h"

namespace moeserve::server {
namespace {

// The socket inode listening on `port` (IPv4 or IPv6), or "".
std::string ListeningInode(int port) {
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
      const size_t colon = local.rfind(':');
      if (colon == std::string::npos || state != "0A") continue;  // 0A: LISTEN
      if (std::stoi(local.substr(colon + 1), nullptr, 16) == port) return inode;
    }
  }
  return "";
}

}  // namespace

std::string ProcessListeningOn(int port) {
  const std::string inode = ListeningInode(port);
  if (inode.empty() || inode == "0") return "";
  const std::string want = absl::StrCat("socket:[", inode, "]");
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return "";
  std::string found;
  while (dirent* d = readdir(proc)) {
    const std::string pid = d->d_name;
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string fd_dir = "/proc/" + pid + "/fd";
    DIR* fds = opendir(fd_dir.c_str());
    if (fds == nullptr) continue;
    while (dirent* f = readdir(fds)) {
      char target[128] = {0};
      const std::string link = fd_dir + "/" + f->d_name;
      if (readlink(link.c_str(), target, sizeof(target) - 1) > 0 && want == target) {
        std::ifstream comm("/proc/" + pid + "/comm");
        std::string name;
        std::getline(comm, name);
        found = absl::StrCat("pid ", pid, " (", name, ")");
        break;
      }
    }
    closedir(fds);
    if (!found.empty()) break;
  }
  closedir(proc);
  return found;
}

}  // namespace moeserve::server
