#include "daemon/custom_policy.h"

#include <dlfcn.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>

#include "daemon/emugpu_policy.h"
#include "error.h"

namespace emugpu::share {

namespace {

constexpr const char* kPlugin = "plugin:";
constexpr const char* kExec = "exec:";

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

emugpu_sharer to_c(const Sharer& s) { return {s.busy, s.iteration_ns, s.priority, s.demand, s.hold_ns}; }

CustomPolicy load_plugin(const std::string& path) {
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  EMUGPU_CHECK(lib != nullptr, kValue, "emugpud: --sharing plugin:", path, ": expected a shared library, got ",
               dlerror());
  using Fn = double (*)(const emugpu_sharer*, const emugpu_sharer*, size_t);
  auto fn = reinterpret_cast<Fn>(dlsym(lib, "emugpu_share_policy"));
  EMUGPU_CHECK(fn != nullptr, kValue, "emugpud: --sharing plugin:", path,
               ": expected an exported C function emugpu_share_policy (csrc/daemon/emugpu_policy.h), got none");
  return [fn](const Sharer& me, const std::vector<Sharer>& others) {
    const emugpu_sharer mine = to_c(me);
    std::vector<emugpu_sharer> theirs;
    theirs.reserve(others.size());
    for (const Sharer& o : others) theirs.push_back(to_c(o));
    return fn(&mine, theirs.data(), theirs.size());
  };
}

// A program that answers share requests on a socket pair (MSG_NOSIGNAL: a
// program that died must not kill the daemon with SIGPIPE).
class Program {
 public:
  explicit Program(const std::string& command) : command_(command) {
    int fds[2];
    EMUGPU_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0, kRuntime,
                 "emugpud: could not start the policy program: socketpair failed (errno ", errno, ")");
    pid_ = fork();
    EMUGPU_CHECK(pid_ >= 0, kRuntime, "emugpud: could not start the policy program: fork failed (errno ", errno, ")");
    if (pid_ == 0) {
      dup2(fds[1], STDIN_FILENO);
      dup2(fds[1], STDOUT_FILENO);
      execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(fds[1]);
    fd_ = fds[0];
  }
  ~Program() {
    close(fd_);
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  // The answer to `request`; throws kRuntime on failure.
  double ask(const std::string& request) {
    EMUGPU_CHECK(send(fd_, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size()),
                 kRuntime, "the policy program stopped reading (it exited?)");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (buffer_.find('\n') == std::string::npos) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      EMUGPU_CHECK(left.count() > 0 && poll(&p, 1, static_cast<int>(left.count())) == 1, kRuntime,
                   "the policy program did not answer within a second");
      char chunk[256];
      const ssize_t n = recv(fd_, chunk, sizeof chunk, 0);
      EMUGPU_CHECK(n > 0, kRuntime, "the policy program closed its output (it exited?)");
      buffer_.append(chunk, static_cast<size_t>(n));
      EMUGPU_CHECK(buffer_.size() < 4096, kRuntime, "the policy program sent a line of over 4 KiB");
    }
    const size_t end = buffer_.find('\n');
    const std::string line = buffer_.substr(0, end);
    buffer_.erase(0, end + 1);
    char* rest = nullptr;
    const double v = std::strtod(line.c_str(), &rest);
    EMUGPU_CHECK(rest != line.c_str() && std::isfinite(v), kRuntime, "the policy program answered '", echo_input(line),
                 "', expected a number");
    return v;
  }
  const std::string& command() const { return command_; }

 private:
  std::string command_;
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string buffer_;
};

std::string request_line(const Sharer& me, const std::vector<Sharer>& others) {
  std::ostringstream out;
  out.precision(17);
  out << others.size();
  auto put = [&](const Sharer& s) {
    out << ' ' << s.busy << ' ' << s.iteration_ns << ' ' << s.priority << ' ' << s.demand << ' ' << s.hold_ns;
  };
  put(me);
  for (const Sharer& o : others) put(o);
  out << '\n';
  return out.str();
}

CustomPolicy load_program(const std::string& command) {
  EMUGPU_CHECK(!command.empty(), kValue, "emugpud: --sharing exec:COMMAND: expected a command, got none");
  auto program = std::make_shared<Program>(command);
  auto failed = std::make_shared<bool>(false);
  SharingConfig fallback;  // the driver's default between processes
  return [program, failed, fallback](const Sharer& me, const std::vector<Sharer>& others) {
    if (!*failed) {
      try {
        return program->ask(request_line(me, others));
      } catch (const Error& e) {
        *failed = true;
        std::fprintf(stderr, "emugpud: policy program '%s': %s; time-slicing from now on\n", program->command().c_str(),
                     e.what());
      }
    }
    return compute_share(fallback, me, others);
  };
}

}  // namespace

bool is_custom_policy(const std::string& spec) { return starts_with(spec, kPlugin) || starts_with(spec, kExec); }

CustomPolicy load_custom_policy(const std::string& spec) {
  if (starts_with(spec, kPlugin)) return load_plugin(spec.substr(std::char_traits<char>::length(kPlugin)));
  EMUGPU_CHECK(starts_with(spec, kExec), kValue, "emugpud: expected plugin:PATH or exec:COMMAND, got \"",
               echo_input(spec), "\"");
  return load_program(spec.substr(std::char_traits<char>::length(kExec)));
}

}  // namespace emugpu::share
