// accelkit: the conformance kit's second process, for checks of what one
// process shares with another (the interprocess group): the kit program
// started again as a peer, and the channel the two talk through. Used by
// testing/conformance/kit.hpp, which serves the peer's role.
//
// Note [The kit's second process]
// Problem: a check of inter-process members needs a second process over
// the same runtime, and the kit program is the vendor's (one translation
// unit with ACCELKIT_CONFORMANCE_SUITE and Catch2's main, or their own):
// the kit owns no entry point in it. A forked child would share the
// driver's state and threads (CUDA refuses a device in a child forked
// after its initialization).
// Decision: the check starts the program itself again, /proc/self/exe with
// no arguments and with ACCELKIT_CONFORMANCE_PEER="<fd>,<group>/<check>,
// <runtime type>" in its environment, <fd> its end of a socket pair the
// two talk through in lines of text. Every check of every runtime, in the
// suite (Conformance<R>::run) and outside it
// (ACCELKIT_CONFORMANCE_EVALUATE), passes through the kit's entry point,
// which reads the variable before anything else: in the started process it
// passes each check over, unrun and unreported, until the one the variable
// names, for the runtime type it names; that check runs as the peer (the
// same check function, which finds kit.peer() set and takes the second
// role), and the process ends there (_Exit: no report written, Catch2's
// run cut short). So a vendor's kit program needs no change. The peer's
// output (Catch2's, the runtime's) goes to an unlinked temporary file whose
// end is quoted when the peer fails; a peer that does not answer within
// ACCELKIT_CONFORMANCE_PEER_TIMEOUT seconds (default 60) is killed and the
// check fails, naming what it waited for.
// Limits: Linux (/proc/self/exe, SOCK_CLOEXEC, MSG_NOSIGNAL, mkostemp);
// where /proc/self/exe cannot be run the checks skip, saying so.
// The program must run its test cases without arguments in declaration
// order (Catch2's default, which the kit relies on already); a main that
// needs arguments, or that filters the kit's test cases out by default,
// leaves the peer without its role, and the check fails naming that.
// Each peer is a new process of the runtime: it makes its own context.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/detail/strings.hpp>

#include <fmt/format.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

ACCELKIT_BEGIN_NAMESPACE
namespace testing {

// The variable that gives a started kit program its peer role.
inline constexpr const char* peer_variable = "ACCELKIT_CONFORMANCE_PEER";

// The peer role this process was started for (Note [The kit's second
// process]), read once; nullopt in a program started normally.
struct PeerRole {
  int fd = -1;
  std::string check;    // "<group>/<check>"
  std::string runtime;  // the runtime's type (typeid(R).name())

  bool names(std::string_view group, std::string_view name, std::string_view runtime_type) const {
    return runtime == runtime_type && check.size() == group.size() + 1 + name.size() &&
           check.compare(0, group.size(), group) == 0 && check[group.size()] == '/' &&
           check.compare(group.size() + 1, std::string::npos, name) == 0;
  }
  static const std::optional<PeerRole>& requested() {
    static const std::optional<PeerRole> role = [] {
      std::optional<PeerRole> r;
      const char* s = std::getenv(peer_variable);
      if (s == nullptr) return r;
      std::string_view v(s);
      std::size_t a = v.find(','), b = a == std::string_view::npos ? a : v.find(',', a + 1);
      if (b == std::string_view::npos) return r;
      PeerRole p;
      p.fd = std::atoi(std::string(v.substr(0, a)).c_str());
      p.check = std::string(v.substr(a + 1, b - a - 1));
      p.runtime = std::string(v.substr(b + 1));
      if (p.fd > 2) r = std::move(p);
      return r;
    }();
    return role;
  }
};

// Seconds a process waits for the other's next line.
inline int peer_timeout_seconds() {
  const char* s = std::getenv("ACCELKIT_CONFORMANCE_PEER_TIMEOUT");
  int t = s ? std::atoi(s) : 0;
  return t > 0 ? t : 60;
}

// One end of the socket pair: lines of text each way. A line "error: ..."
// from the other side is thrown (std::runtime_error) by receive().
class PeerChannel {
 public:
  PeerChannel(int fd, std::string other) : fd_(fd), other_(std::move(other)) {}
  ~PeerChannel() {
    if (fd_ >= 0) ::close(fd_);
  }
  PeerChannel(const PeerChannel&) = delete;
  PeerChannel& operator=(const PeerChannel&) = delete;

  // Sends one line (no newline inside).
  void send(std::string_view line) {
    std::string s(line);
    s += '\n';
    std::size_t done = 0;
    while (done < s.size()) {
      ssize_t n = ::send(fd_, s.data() + done, s.size() - done, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        throw std::runtime_error(fmt::format("could not send \"{}\" to the {}: {}", line, other_,
                                             std::strerror(errno)));
      done += static_cast<std::size_t>(n);
    }
  }
  // The next line, waiting at most the peer timeout; `waiting_for` names
  // the answer in the error when none comes.
  std::string receive(std::string_view waiting_for) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(peer_timeout_seconds());
    for (;;) {
      std::size_t nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        if (line.compare(0, 7, "error: ") == 0)
          throw std::runtime_error(fmt::format("the {}: {}", other_, line.substr(7)));
        return line;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0)
        throw std::runtime_error(fmt::format("the {} did not answer ({}) within {} s", other_,
                                             waiting_for, peer_timeout_seconds()));
      pollfd p{fd_, POLLIN, 0};
      int r = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 1000)));
      if (r < 0 && errno != EINTR)
        throw std::runtime_error(fmt::format("poll: {}", std::strerror(errno)));
      if (r <= 0) continue;
      char chunk[4096];
      ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        throw std::runtime_error(fmt::format("the {} ended before it answered ({}){}", other_,
                                             waiting_for, ended_ ? ended_() : std::string()));
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
  }
  // Sends `line` and returns the answer.
  std::string ask(std::string_view line, std::string_view waiting_for) {
    send(line);
    return receive(waiting_for);
  }
  // What receive() adds to its error when the other side is gone (how it
  // ended).
  void on_end(std::function<std::string()> describe) { ended_ = std::move(describe); }

 private:
  int fd_;
  std::string other_;
  std::string buffer_;
  std::function<std::string()> ended_;
};

using ::accelkit::detail::from_hex;
using ::accelkit::detail::to_hex;

// The kit program started again as the peer of one check (Note [The kit's
// second process]). The destructor kills a peer still running and waits
// for it, so a check that throws leaves no process behind.
class PeerProcess {
 public:
  // Why a peer cannot be started on this system, or "".
  static std::string unavailable() {
    if (::access("/proc/self/exe", X_OK) != 0)
      return "the kit starts its second process from /proc/self/exe, which this system lacks";
    return {};
  }

  PeerProcess(std::string_view group, std::string_view check, std::string_view runtime_type) {
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
      throw std::runtime_error(fmt::format("socketpair: {}", std::strerror(errno)));
    std::string dir = std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp";
    std::string path = dir + "/accelkit_kit_peer_XXXXXX";
    output_ = ::mkostemp(path.data(), O_CLOEXEC);
    if (output_ < 0) {
      int e = errno;
      ::close(pair[0]);
      ::close(pair[1]);
      throw std::runtime_error(fmt::format("mkostemp({}): {}", path, std::strerror(e)));
    }
    ::unlink(path.c_str());
    // Everything the child needs, made before fork (after it, only calls
    // that are safe in the child of a threaded process).
    std::string role = fmt::format("{}={},{}/{},{}", peer_variable, pair[1], group, check,
                                   runtime_type);
    std::vector<std::string> env;
    for (char** e = environ; e && *e; ++e)
      if (std::strncmp(*e, peer_variable, std::strlen(peer_variable)) != 0 ||
          (*e)[std::strlen(peer_variable)] != '=')
        env.emplace_back(*e);
    env.push_back(role);
    std::vector<char*> envp;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    static char exe[] = "/proc/self/exe";
    char* argv[] = {exe, nullptr};
    int child_fd = pair[1], out = output_;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::fcntl(child_fd, F_SETFD, 0);  // kept across exec
      ::dup2(out, 1);
      ::dup2(out, 2);
      ::execve(exe, argv, envp.data());
      ::_exit(127);
    }
    int e = errno;
    ::close(pair[1]);
    if (pid_ < 0) {
      ::close(pair[0]);
      throw std::runtime_error(fmt::format("fork: {}", std::strerror(e)));
    }
    channel_.emplace(pair[0], fmt::format("second process (pid {})", pid_));
    channel_->on_end([this] { return describe_end(); });
  }
  ~PeerProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
    }
    if (output_ >= 0) ::close(output_);
  }
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  PeerChannel& channel() { return *channel_; }
  pid_t pid() const noexcept { return pid_; }

  // Waits for the peer's last line ("done") and its exit; throws (naming
  // how it ended) unless it ended so, with status 0.
  void finish() {
    std::string last = channel_->receive("its last line, \"done\"");
    if (last != "done")
      throw std::runtime_error(fmt::format("the second process ended its role with \"{}\", "
                                           "not \"done\"",
                                           last));
    std::string how = wait_exit();
    if (!how.empty()) throw std::runtime_error(fmt::format("the second process {}", how));
  }

  // The end of the peer's output (its stdout and stderr), its last lines
  // but Catch2's rules joined with " | ", at most `bytes` of them.
  std::string output_tail(std::size_t bytes = 600) const {
    off_t size = ::lseek(output_, 0, SEEK_END);
    if (size <= 0) return {};
    off_t from = size > static_cast<off_t>(bytes) ? size - static_cast<off_t>(bytes) : 0;
    std::string s(static_cast<std::size_t>(size - from), '\0');
    ssize_t n = ::pread(output_, s.data(), s.size(), from);
    s.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    std::string out, line;
    auto flush = [&] {
      bool rule = line.find_first_not_of("-.~= \t") == std::string::npos;
      if (!rule) out += (out.empty() ? "" : " | ") + line;
      line.clear();
    };
    for (char c : s) {
      if (c == '\n') flush();
      else line += c;
    }
    flush();
    return out;
  }

 private:
  // "" for exit status 0; else how it ended. Waits at most the timeout.
  std::string wait_exit() {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(peer_timeout_seconds());
    int status = 0;
    for (;;) {
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) break;
      if (r < 0 && errno != EINTR) return fmt::format("could not be waited for: {}", std::strerror(errno));
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
        }
        pid_ = -1;
        return fmt::format("did not exit within {} s (killed)", peer_timeout_seconds());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    pid_ = -1;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return {};
    std::string how = WIFEXITED(status) ? fmt::format("exited with status {}", WEXITSTATUS(status))
                      : WIFSIGNALED(status) ? fmt::format("was killed by signal {}", WTERMSIG(status))
                                            : std::string("ended");
    std::string tail = output_tail();
    return tail.empty() ? how : fmt::format("{}; the end of its output: {}", how, tail);
  }
  std::string describe_end() {
    if (pid_ <= 0) return {};
    std::string how = wait_exit();
    if (how.empty())
      how = "exited with status 0 without taking its role (does the program run every test "
            "case when started without arguments?)";
    return fmt::format(": it {}", how);
  }

  pid_t pid_ = -1;
  int output_ = -1;
  std::optional<PeerChannel> channel_;
};

}  // namespace testing
ACCELKIT_END_NAMESPACE
