// emugpud's server and sessions in this process, driven by real clients over
// a Unix socket (and TCP on loopback): attach, share, hang up, misbehave.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>  // Boost 1.74's asio/awaitable.hpp uses std::exchange without it

#include <boost/asio.hpp>

#include "daemon/handler.h"
#include "daemon/server.h"
#include "error.h"
#include "share/client.h"

namespace {

using namespace emugpu::share;

constexpr uint64_t kMiB = 1 << 20;

// A daemon on its own thread, listening on a fresh socket.
class Daemon {
 public:
  explicit Daemon(const std::string& listen = "")
      : handler_({{"NVIDIA H100 80GB HBM3", 64 * kMiB, 80 * kMiB, 0, -1, "", ""}}),
        path_(std::filesystem::temp_directory_path() /
              ("emugpud-test-" + std::to_string(getpid()) + "-" + std::to_string(counter_++) + ".sock")),
        server_(io_, handler_, parse_address(listen.empty() ? "unix:" + path_.string() : listen, "test")),
        address_(server_.address()),  // before the daemon's thread runs: only that thread touches it then
        thread_([this] { io_.run(); }) {}
  ~Daemon() {
    boost::asio::post(io_, [this] { server_.stop(); });
    thread_.join();
  }
  const std::string& address() const { return address_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  boost::asio::io_context io_;
  Handler handler_;
  std::filesystem::path path_;
  Server server_;
  std::string address_;
  std::thread thread_;
};

uint64_t used(const std::string& address) { return Client::query(address).used.at(0); }

// Polls until the daemon reports `bytes` in use (a hang-up is seen asynchronously);
// bounded loosely, so that a loaded host cannot fail it.
bool used_becomes(const std::string& address, uint64_t bytes) {
  for (int i = 0; i < 2000; ++i) {
    if (used(address) == bytes) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

TEST(ShareDaemon, ClientsAttachAndShareTheGpusMemory) {
  Daemon d;
  Client a(d.address(), {1, "real", "job a"});
  Client b(d.address(), {2, "real", "job b"});
  EXPECT_EQ(a.welcome().gpus.size(), 1u);
  EXPECT_NE(a.welcome().client, b.welcome().client);
  EXPECT_FALSE(a.reserve(0, 40 * kMiB));
  const auto refused = b.reserve(0, 30 * kMiB);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->used, 40 * kMiB);
  EXPECT_FALSE(b.reserve(0, 24 * kMiB));
  a.release(0, 40 * kMiB);
  EXPECT_FALSE(b.reserve(0, 30 * kMiB));
  const Status s = a.status();
  ASSERT_EQ(s.clients.size(), 2u);
  EXPECT_EQ(s.clients[1].name, "job b");
  EXPECT_EQ(s.clients[1].bytes[0], 54 * kMiB);
}

TEST(ShareDaemon, AClientThatHangsUpReleasesItsMemoryAtOnce) {
  Daemon d;
  {
    Client gone(d.address(), {1, "real", "killed"});
    ASSERT_FALSE(gone.reserve(0, 60 * kMiB));
    EXPECT_EQ(used(d.address()), 60 * kMiB);
  }  // the socket closes, as when the process dies
  EXPECT_TRUE(used_becomes(d.address(), 0));
  Client next(d.address(), {2, "real", "next"});
  EXPECT_FALSE(next.reserve(0, 64 * kMiB));
}

TEST(ShareDaemon, GarbageDropsThatConnectionOnly) {
  Daemon d;
  Client good(d.address(), {1, "real", "good"});
  ASSERT_FALSE(good.reserve(0, 8 * kMiB));
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strcpy(sa.sun_path, d.path().c_str());
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  const char garbage[] = "GET / HTTP/1.1\r\nHost: emugpud\r\n\r\n";
  ASSERT_GT(::send(fd, garbage, sizeof(garbage), MSG_NOSIGNAL), 0);
  char byte;
  EXPECT_EQ(::recv(fd, &byte, 1, 0), 0);  // the daemon hung up on it
  ::close(fd);
  EXPECT_FALSE(good.reserve(0, 8 * kMiB));  // and carries on for the others
  EXPECT_EQ(used(d.address()), 16 * kMiB);
}

TEST(ShareDaemon, TheSocketIsOnlyItsUsersAndALeftoverOneIsReplaced) {
  const auto path = std::filesystem::temp_directory_path() / ("emugpud-test-stale-" + std::to_string(getpid()));
  {
    Daemon first("unix:" + path.string());
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    try {  // a second daemon on a live socket is refused
      boost::asio::io_context io;
      Handler h({{"g", kMiB, kMiB, 0, -1, "", ""}});
      Server clash(io, h, parse_address("unix:" + path.string(), "test"));
      ADD_FAILURE() << "a second daemon listened on a live socket";
    } catch (const emugpu::Error& e) {
      EXPECT_NE(std::string(e.what()).find("another daemon listens"), std::string::npos) << e.what();
    }
  }
  // A socket file nobody accepts on (a daemon that was killed) is replaced.
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strcpy(sa.sun_path, path.c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  ::close(fd);
  Daemon second("unix:" + path.string());
  Client c(second.address(), {1, "real", "x"});
  EXPECT_FALSE(c.reserve(0, kMiB));
}

TEST(ShareDaemon, NoDaemonIsAnErrorNamingTheAddressAndHowToStartOne) {
  try {
    Client c("unix:/nonexistent/emugpud.sock", {1, "real", "x"});
    FAIL() << "connected to nothing";
  } catch (const emugpu::Error& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("unix:/nonexistent/emugpud.sock"), std::string::npos) << text;
    EXPECT_NE(text.find("torch-emugpu daemon"), std::string::npos) << text;
  }
}

TEST(ShareDaemon, ADaemonThatStopsFailsItsClientsClearly) {
  auto d = std::make_unique<Daemon>();
  Client c(d->address(), {1, "real", "x"});
  d.reset();
  try {
    c.reserve(0, kMiB);
    FAIL() << "a reserve succeeded without a daemon";
  } catch (const emugpu::Error& e) {
    EXPECT_NE(std::string(e.what()).find("lost the daemon"), std::string::npos) << e.what();
  }
}

TEST(ShareDaemon, ServesTcpOnLoopback) {
  Daemon d("tcp:127.0.0.1:0");
  EXPECT_EQ(d.address().rfind("tcp:127.0.0.1:", 0), 0u);
  EXPECT_NE(d.address(), "tcp:127.0.0.1:0");
  Client c(d.address(), {1, "real", "x"});
  EXPECT_FALSE(c.reserve(0, kMiB));
  EXPECT_EQ(used(d.address()), kMiB);
}

}  // namespace
