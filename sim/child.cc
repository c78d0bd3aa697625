#include "sim/child.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <string_view>

#include "absl/strings/match.h"

extern char** environ;

namespace rdp::sim {
namespace {

// The environment of this process with `changes` applied, as "NAME=value" strings.
std::vector<std::string> ChildEnvironment(
    const std::map<std::string, std::optional<std::string>>& changes) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    if (changes.count(name) == 0) env.push_back(entry);
  }
  for (const auto& [name, value] : changes) {
    if (value) env.push_back(name + "=" + *value);
  }
  return env;
}

}  // namespace

Child::Child(const std::string& binary, const std::vector<std::string>& args, Options options)
    : binary_(binary) {
  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(binary.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_strings = ChildEnvironment(options.env);
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  const bool capture = options.output != Output::kDiscard;
  const bool forward = options.output == Output::kCaptureAndForward;
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  if (capture && (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)) return;
  const int devnull = capture ? -1 : ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::dup2(capture ? out[1] : devnull, STDOUT_FILENO);
    ::dup2(capture ? err[1] : devnull, STDERR_FILENO);
    ::execve(binary.c_str(), argv.data(), envp.data());
    ::_exit(127);
  }
  for (int fd : {out[1], err[1], devnull}) {
    if (fd >= 0) ::close(fd);
  }
  if (pid < 0) {
    for (int fd : {out[0], err[0]}) {
      if (fd >= 0) ::close(fd);
    }
    return;
  }
  pid_ = pid;
  pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (capture) {
    {
      absl::MutexLock lock(&mu_);
      open_pipes_ = 2;
    }
    readers_.emplace_back([this, fd = out[0]] { Collect(fd, true, false); });
    readers_.emplace_back([this, fd = err[0], forward] { Collect(fd, false, forward); });
  }
}

Child::~Child() {
  Reap();
  if (pidfd_ >= 0) ::close(pidfd_);
}

void Child::Reap() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  for (std::thread& t : readers_) {
    if (t.joinable()) t.join();
  }
}

bool Child::Exited() const {
  if (pid_ <= 0) return true;
  struct pollfd p = {pidfd_, POLLIN, 0};
  return pidfd_ >= 0 && ::poll(&p, 1, 0) > 0;
}

void Child::Signal(int sig) const {
  if (pid_ > 0) ::kill(pid_, sig);
}

int Child::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return -1;
  int ready = 1;
  if (pidfd_ >= 0) {
    struct pollfd p = {pidfd_, POLLIN, 0};
    do {
      ready = ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout)));
    } while (ready < 0 && errno == EINTR);
    if (ready <= 0) ::kill(pid_, SIGKILL);
  }
  int status = 0;
  const bool reaped = ::waitpid(pid_, &status, 0) == pid_;
  pid_ = -1;
  for (std::thread& t : readers_) {
    if (t.joinable()) t.join();  // the pipes are at their end: the child is gone
  }
  if (ready <= 0 || !reaped || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

bool Child::WaitForOutput(const std::string& text, absl::Duration timeout) const {
  return WaitForOutput([&text](const std::string& out) { return absl::StrContains(out, text); },
                       timeout);
}

bool Child::WaitForOutput(const std::function<bool(const std::string&)>& done,
                          absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (!done(output_) && open_pipes_ > 0) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  return done(output_);
}

std::string Child::stdout_text() const {
  absl::MutexLock lock(&mu_);
  return stdout_;
}

std::string Child::output() const {
  absl::MutexLock lock(&mu_);
  return output_;
}

void Child::Collect(int fd, bool is_stdout, bool forward) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    // Best effort: our stderr gone (a closed terminal) does not stop the collection.
    if (forward) (void)!::write(STDERR_FILENO, buf, static_cast<std::size_t>(n));
    absl::MutexLock lock(&mu_);
    if (is_stdout) stdout_.append(buf, static_cast<std::size_t>(n));
    output_.append(buf, static_cast<std::size_t>(n));
    cv_.SignalAll();
  }
  ::close(fd);
  absl::MutexLock lock(&mu_);
  --open_pipes_;
  cv_.SignalAll();
}

std::string WaitForMetricsAddress(const Child& plugin, absl::Duration timeout) {
  constexpr std::string_view kServing = "metrics: serving on ";
  // The address, once its line is whole; "" before.
  auto address = [kServing](const std::string& out) -> std::string {
    const std::size_t line = out.find(kServing);
    if (line == std::string::npos) return "";
    const std::size_t at = line + kServing.size();
    const std::size_t end = out.find_first_of("\r\n", at);
    return end == std::string::npos ? "" : out.substr(at, end - at);
  };
  plugin.WaitForOutput([&](const std::string& out) { return !address(out).empty(); }, timeout);
  return address(plugin.output());
}

}  // namespace rdp::sim
