// emugpud under concurrent clients: N client threads, each attached over
// its own Unix socket, reserve and release a 2 MiB segment as fast as they
// can for a few seconds against a daemon on its own thread (the same
// server, sessions and handler the emugpud executable runs). Prints the
// requests per second of all clients together and the latency percentiles
// of one request. Target: above 50,000 requests/s and p99 under 100 us with
// 8 clients (docs/benchmarks.md).
//
// The baseline, measured first in the same process with the same clients:
// a server that does nothing but echo, one thread on epoll, answering each
// request of the same size as a reserve or release. It is the floor this
// machine's sockets and thread wake-ups set, which no daemon can go below;
// the ratios say what emugpud adds to it.
//
//   build/core/emugpud_requests [CLIENTS] [SECONDS]
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <utility>  // Boost 1.74's asio/awaitable.hpp uses std::exchange without it
#include <vector>

#include <boost/asio.hpp>

#include "daemon/handler.h"
#include "daemon/server.h"
#include "share/client.h"
#include "share/protocol.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Result {
  size_t requests = 0;
  double wall_s = 0;
  double p50 = 0, p99 = 0, max = 0;  // us
};

// `clients` threads, each with its own requester from `make(c)`, call it as fast as they can for `seconds`.
Result load(int clients, double seconds, const std::function<std::function<void(size_t)>(int)>& make) {
  std::atomic<bool> go{false};
  std::vector<std::vector<double>> latencies(static_cast<size_t>(clients));
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      const std::function<void(size_t)> request = make(c);
      auto& mine = latencies[static_cast<size_t>(c)];
      mine.reserve(1 << 20);
      while (!go.load()) std::this_thread::yield();
      const auto end = Clock::now() + std::chrono::duration<double>(seconds);
      for (size_t i = 0; Clock::now() < end; ++i) {
        const auto t0 = Clock::now();
        request(i);
        mine.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
    });
  }
  const auto start = Clock::now();
  go = true;
  for (auto& t : threads) t.join();
  Result r;
  r.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  std::vector<double> all;
  for (const auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  const auto pct = [&](double p) { return all.empty() ? 0.0 : all[static_cast<size_t>(p * (all.size() - 1))]; };
  r.requests = all.size();
  r.p50 = pct(0.50);
  r.p99 = pct(0.99);
  r.max = all.empty() ? 0.0 : all.back();
  return r;
}

void print(const char* what, int clients, const Result& r) {
  std::printf("%-8s %d clients, %.1f s: %zu requests, %.0f requests/s; latency p50 %.1f us, p99 %.1f us, max %.1f us\n",
              what, clients, r.wall_s, r.requests, static_cast<double>(r.requests) / r.wall_s, r.p50, r.p99, r.max);
}

int connect_unix(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    std::perror("echo baseline: connect");
    std::exit(1);
  }
  return fd;
}

// The floor: one thread on epoll that writes back whatever arrives.
class EchoServer {
 public:
  explicit EchoServer(std::string path) : path_(std::move(path)) {
    listen_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::memcpy(sa.sun_path, path_.c_str(), path_.size() + 1);
    if (listen_ < 0 || ::bind(listen_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
        ::listen(listen_, 64) != 0) {
      std::perror("echo baseline: listen");
      std::exit(1);
    }
    thread_ = std::thread([this] { run(); });
  }
  ~EchoServer() {
    stop_ = true;
    thread_.join();
    ::close(listen_);
    ::unlink(path_.c_str());
  }

 private:
  void run() {
    const int ep = ::epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = listen_;
    ::epoll_ctl(ep, EPOLL_CTL_ADD, listen_, &ev);
    std::vector<epoll_event> ready(64);
    char buffer[4096];
    while (!stop_) {
      const int n = ::epoll_wait(ep, ready.data(), static_cast<int>(ready.size()), 50);
      for (int i = 0; i < n; ++i) {
        const int fd = ready[static_cast<size_t>(i)].data.fd;
        if (fd == listen_) {
          for (int c; (c = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC)) >= 0;) {
            epoll_event cev{};
            cev.events = EPOLLIN;
            cev.data.fd = c;
            ::epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
          }
          continue;
        }
        const ssize_t got = ::read(fd, buffer, sizeof(buffer));
        if (got <= 0) {
          ::epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
          ::close(fd);
          continue;
        }
        for (ssize_t sent = 0; sent < got;) {
          const ssize_t w = ::write(fd, buffer + sent, static_cast<size_t>(got - sent));
          if (w <= 0) break;
          sent += w;
        }
      }
    }
    ::close(ep);
  }

  std::string path_;
  int listen_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace emugpu::share;
  const int clients = argc > 1 ? std::atoi(argv[1]) : 8;
  const double seconds = argc > 2 ? std::atof(argv[2]) : 3.0;
  const auto dir = std::filesystem::temp_directory_path();
  const std::string tag = std::to_string(getpid()) + ".sock";
  std::printf("%u cores\n", std::thread::hardware_concurrency());

  // A request as long as a reserve or release: the header and its GPU index and byte count.
  const size_t request_bytes = encode_bytes(MessageType::kReserve, 1, {0, 2u << 20}).size();
  const std::string echo_path = (dir / ("emugpud-bench-echo-" + tag)).string();
  Result echo;
  {
    const EchoServer server(echo_path);
    echo = load(clients, seconds, [&](int) {
      struct Connection {
        int fd = -1;
        std::vector<char> bytes;
        ~Connection() { ::close(fd); }
      };
      auto conn = std::make_shared<Connection>();
      conn->fd = connect_unix(echo_path);
      conn->bytes.assign(request_bytes, 1);
      return std::function<void(size_t)>([conn](size_t) {
        const size_t size = conn->bytes.size();
        if (::write(conn->fd, conn->bytes.data(), size) != static_cast<ssize_t>(size)) return;
        for (size_t got = 0; got < size;) {
          const ssize_t n = ::read(conn->fd, conn->bytes.data() + got, size - got);
          if (n <= 0) return;
          got += static_cast<size_t>(n);
        }
      });
    });
  }
  print("echo", clients, echo);

  boost::asio::io_context io;
  Handler handler({{"NVIDIA H100 80GB HBM3", 80ull << 30, 80ull << 30, 0, -1, "", ""}});
  Server server(io, handler, parse_address("unix:" + (dir / ("emugpud-bench-" + tag)).string(), "bench"));
  const std::string address = server.address();
  std::thread daemon([&] { io.run(); });
  const Result emugpud = load(clients, seconds, [&](int c) {
    auto client = std::make_shared<Client>(address, Hello{getpid(), "real", "bench " + std::to_string(c)});
    return std::function<void(size_t)>([client](size_t i) {
      if (i % 2 == 0) {
        (void)client->reserve(0, 2u << 20);
      } else {
        client->release(0, 2u << 20);
      }
    });
  });
  boost::asio::post(io, [&] { server.stop(); });
  daemon.join();
  print("emugpud", clients, emugpud);
  std::printf(
      "emugpud/echo: requests/s %.2fx, p50 %.2fx, p99 %.2fx\n",
      (static_cast<double>(emugpud.requests) / emugpud.wall_s) / (static_cast<double>(echo.requests) / echo.wall_s),
      emugpud.p50 / echo.p50, emugpud.p99 / echo.p99);
  return 0;
}
