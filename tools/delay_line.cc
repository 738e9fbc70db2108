// moeserve-delay-line: the link between network-namespace "hosts" with a one-way delay, for
// kernels without the netem qdisc (scripts/netns-hosts.sh starts it for `up N --delay D` when
// sch_netem is missing, and stops it at `down`).
//
// It opens a TUN device named eth0 in each namespace <prefix>0 .. <prefix>N-1 and one named
// <prefix>br in its own (root) namespace, and forwards IPv4 packets between them by destination
// address: <subnet>.1 is the root namespace, <subnet>.(10 + i) namespace i. A packet from one
// namespace to another is held for the delay, then written to its destination; packets to or
// from the root namespace (the launcher's control traffic) pass at once. Delayed packets keep
// their order (one delay for all: a FIFO). The rate stays tc's (a tbf qdisc on each eth0).
// Other packets (IPv6, other addresses) are dropped and counted. SIGTERM or SIGINT ends it, and
// its devices go with it.
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <string>
#include <vector>

namespace {

struct Options {
  std::string prefix = "msh";
  int namespaces = 2;
  std::string subnet = "10.77.0";
  int64_t delay_us = 0;
  std::string ready_file;
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "moeserve-delay-line: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

int64_t NowNs() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

// A TUN device `name` (IPv4 packets, no packet-info header) in namespace `netns` ("" : ours).
int OpenTun(const std::string& netns, const std::string& name) {
  const int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (home < 0) Die("open /proc/self/ns/net");
  if (!netns.empty()) {
    const std::string path = "/var/run/netns/" + netns;
    const int ns = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0 || setns(ns, CLONE_NEWNET) != 0) Die("enter namespace " + netns);
    close(ns);
  }
  const int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) Die("open /dev/net/tun");
  ifreq ifr{};
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
  std::snprintf(ifr.ifr_name, IFNAMSIZ, "%s", name.c_str());
  if (ioctl(fd, TUNSETIFF, &ifr) != 0) Die("make TUN device " + name + (netns.empty() ? "" : " in " + netns));
  if (setns(home, CLONE_NEWNET) != 0) Die("return to the root namespace");
  close(home);
  return fd;
}

uint32_t ParseSubnet(const std::string& s) {
  unsigned a, b, c;
  char tail;
  if (std::sscanf(s.c_str(), "%u.%u.%u%c", &a, &b, &c, &tail) != 3 || a > 255 || b > 255 || c > 255) {
    std::fprintf(stderr, "moeserve-delay-line: --subnet: A.B.C expected, got '%s'\n", s.c_str());
    std::exit(2);
  }
  return (a << 24) | (b << 16) | (c << 8);
}

struct Held {
  int64_t release_ns;
  int dest;  // index into the devices
  std::vector<uint8_t> bytes;
};

class DelayLine {
 public:
  DelayLine(const Options& o, std::vector<int> tuns) : o_(o), tuns_(std::move(tuns)), subnet_(ParseSubnet(o.subnet)) {}

  // Device index of an IPv4 packet's destination: 0 the root namespace, 1 + i namespace i.
  int Route(const uint8_t* p, ssize_t n) const {
    if (n < 20 || (p[0] >> 4) != 4) return -1;
    const uint32_t dst = (uint32_t{p[16]} << 24) | (uint32_t{p[17]} << 16) | (uint32_t{p[18]} << 8) | p[19];
    if ((dst & 0xffffff00u) != subnet_) return -1;
    const int host = static_cast<int>(dst & 0xff);
    if (host == 1) return 0;
    return host >= 10 && host < 10 + o_.namespaces ? 1 + (host - 10) : -1;
  }

  // Reads every packet waiting on device `from`: forwards or holds each.
  void Drain(int from) {
    uint8_t buf[65536];
    for (;;) {
      const ssize_t n = read(tuns_[from], buf, sizeof(buf));
      if (n <= 0) return;
      const int dest = Route(buf, n);
      if (dest < 0 || dest == from) {
        ++dropped_;
      } else if (from == 0 || dest == 0 || o_.delay_us == 0) {
        Write(dest, buf, n);
      } else {
        held_.push_back({NowNs() + o_.delay_us * 1000, dest, std::vector<uint8_t>(buf, buf + n)});
      }
    }
  }

  // Writes the packets whose time has come; returns when the next one is due (0: none held).
  int64_t Release() {
    const int64_t now = NowNs();
    while (!held_.empty() && held_.front().release_ns <= now) {
      Write(held_.front().dest, held_.front().bytes.data(), static_cast<ssize_t>(held_.front().bytes.size()));
      held_.pop_front();
    }
    return held_.empty() ? 0 : held_.front().release_ns;
  }

  int64_t dropped() const { return dropped_; }
  int64_t forwarded() const { return forwarded_; }

 private:
  void Write(int dest, const uint8_t* p, ssize_t n) {
    if (write(tuns_[dest], p, static_cast<size_t>(n)) == n) {
      ++forwarded_;
    } else {
      ++dropped_;  // as a lossy link would: TCP sends it again
    }
  }

  const Options& o_;
  std::vector<int> tuns_;
  uint32_t subnet_;
  std::deque<Held> held_;
  int64_t dropped_ = 0, forwarded_ = 0;
};

void Add(int epoll, int fd, uint64_t tag) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = tag;
  if (epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &ev) != 0) Die("epoll_ctl");
}

int Run(const Options& o) {
  std::vector<int> tuns = {OpenTun("", o.prefix + "br")};
  for (int i = 0; i < o.namespaces; ++i) tuns.push_back(OpenTun(o.prefix + std::to_string(i), "eth0"));
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  sigprocmask(SIG_BLOCK, &stop, nullptr);
  const int sig = signalfd(-1, &stop, SFD_CLOEXEC);
  const int timer = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  const int epoll = epoll_create1(EPOLL_CLOEXEC);
  if (sig < 0 || timer < 0 || epoll < 0) Die("signalfd, timerfd or epoll");
  const uint64_t kTimer = 1000, kSignal = 1001;
  for (size_t i = 0; i < tuns.size(); ++i) Add(epoll, tuns[i], i);
  Add(epoll, timer, kTimer);
  Add(epoll, sig, kSignal);
  DelayLine line(o, tuns);
  if (!o.ready_file.empty()) std::ofstream(o.ready_file) << getpid() << "\n";
  std::fprintf(stderr, "moeserve-delay-line: %d namespaces on %s.0/24, one-way delay %lld us\n", o.namespaces,
               o.subnet.c_str(), static_cast<long long>(o.delay_us));
  for (;;) {
    epoll_event events[16];
    const int n = epoll_wait(epoll, events, 16, -1);
    if (n < 0 && errno != EINTR) Die("epoll_wait");
    for (int k = 0; k < n; ++k) {
      const uint64_t tag = events[k].data.u64;
      if (tag == kSignal) {
        std::fprintf(stderr, "moeserve-delay-line: stopped; %lld packets forwarded, %lld dropped\n",
                     static_cast<long long>(line.forwarded()), static_cast<long long>(line.dropped()));
        return 0;
      }
      if (tag == kTimer) {
        uint64_t expirations;
        (void)!read(timer, &expirations, sizeof(expirations));
      } else {
        line.Drain(static_cast<int>(tag));
      }
    }
    // The timer always names the head of the queue (absolute time; 0 disarms it).
    const int64_t next = line.Release();
    itimerspec when{};
    when.it_value.tv_sec = next / 1000000000;
    when.it_value.tv_nsec = next % 1000000000;
    timerfd_settime(timer, TFD_TIMER_ABSTIME, &when, nullptr);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"A link with a one-way delay between network namespaces (TUN devices; for kernels without netem)"};
  app.add_option("--prefix", o.prefix, "Namespaces <prefix>0..N-1 (scripts/netns-hosts.sh's --prefix)")
      ->capture_default_str();
  app.add_option("--namespaces", o.namespaces, "How many namespaces (1-64)")->capture_default_str()->check(CLI::Range(1, 64));
  app.add_option("--subnet", o.subnet, "The namespaces' /24: A.B.C (root .1, namespace i .10+i)")->capture_default_str();
  app.add_option("--delay-us", o.delay_us, "One-way delay between two namespaces, microseconds")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{10000000}));
  app.add_option("--ready-file", o.ready_file, "Written (with the pid) once every device exists");
  CLI11_PARSE(app, argc, argv);
  return Run(o);
}
