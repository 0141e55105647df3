#include "config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "error.h"

namespace {

using emugpu::ConfigRequest;
using emugpu::Mode;

struct CleanEnvironment : ::testing::Test {
  void SetUp() override {
    for (const char* v : {"EMUGPU_GPU",      "EMUGPU_DEVICE_COUNT",   "EMUGPU_MODE",       "EMUGPU_CATALOG",
                          "EMUGPU_NET_GBPS", "EMUGPU_HOST_COPY_GBPS", "EMUGPU_HOST_OP_US", "EMUGPU_NET_LATENCY_US",
                          "EMUGPU_EXCHANGE", "LOCAL_WORLD_SIZE",      "NCCL_ALGO",         "TORCHELASTIC_RUN_ID",
                          "MASTER_ADDR",     "MASTER_PORT",           "GROUP_RANK",        "EMUGPU_PROFILE_PATH",
                          "EMUGPU_PROFILES", "EMUGPU_CALIBRATION",    "XDG_DATA_HOME",     "EMUGPU_CLOCK",
                          "EMUGPU_HOST",     "EMUGPU_HOST_SPEED",     "EMUGPU_HOST_COST"}) {
      unsetenv(v);
    }
  }
  void TearDown() override { SetUp(); }
};

TEST_F(CleanEnvironment, DefaultsNeedNothingSet) {
  const auto c = emugpu::resolve_config({}, "/x/gpus.json");
  EXPECT_EQ(c.gpu, emugpu::kDefaultGpu);
  EXPECT_EQ(c.device_count, 1);
  EXPECT_EQ(c.mode, Mode::kTiming);
  EXPECT_EQ(c.catalog_path, "/x/gpus.json");
  EXPECT_EQ(c.net_gbps, 100);  // 4 x 200 Gb/s InfiniBand per node
  EXPECT_EQ(c.net_latency_us, 3);
}

TEST_F(CleanEnvironment, PcieSegmentsAreNamedByUserJobAndNode) {
  EXPECT_EQ(emugpu::resolve_config({}, "").pcie_segment, "");  // not under torchrun: in-process uplinks
  setenv("TORCHELASTIC_RUN_ID", "none", 1);                    // torchrun's default for every job
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "29500", 1);
  const std::string first = emugpu::resolve_config({}, "").pcie_segment;
  EXPECT_EQ(first.rfind("/emugpu-u" + std::to_string(geteuid()) + "-pcie-none-", 0), 0u) << first;
  EXPECT_EQ(emugpu::resolve_config({}, "").pcie_segment, first);  // every rank of the node derives it
  setenv("MASTER_PORT", "29501", 1);                              // another job on the same machine
  EXPECT_NE(emugpu::resolve_config({}, "").pcie_segment, first);
  setenv("MASTER_PORT", "29500", 1);
  setenv("GROUP_RANK", "1", 1);  // another emulated node of the same job
  EXPECT_NE(emugpu::resolve_config({}, "").pcie_segment, first);
}

TEST_F(CleanEnvironment, NcclAlgoIsKeptAsSetForTheCollectiveModel) {
  EXPECT_EQ(emugpu::resolve_config({}, "").nccl_algo, "");
  setenv("NCCL_ALGO", "Rign", 1);  // a bad value fails the collectives that use it, not the device
  EXPECT_EQ(emugpu::resolve_config({}, "").nccl_algo, "Rign");
}

TEST_F(CleanEnvironment, TorchrunsLocalWorldSizeIsTheDefaultDeviceCount) {
  setenv("LOCAL_WORLD_SIZE", "4", 1);
  EXPECT_EQ(emugpu::resolve_config({}, "").device_count, 4);
  setenv("EMUGPU_DEVICE_COUNT", "8", 1);  // an explicit count wins
  EXPECT_EQ(emugpu::resolve_config({}, "").device_count, 8);
  unsetenv("EMUGPU_DEVICE_COUNT");
  setenv("LOCAL_WORLD_SIZE", "many", 1);
  try {
    emugpu::resolve_config({}, "");
    FAIL() << "expected an error";
  } catch (const emugpu::Error& e) {
    EXPECT_NE(std::string(e.what()).find("LOCAL_WORLD_SIZE"), std::string::npos) << e.what();
  }
}

TEST_F(CleanEnvironment, NetworkComesFromTheEnvironmentOrTheCaller) {
  setenv("EMUGPU_NET_GBPS", " 50 ", 1);
  setenv("EMUGPU_NET_LATENCY_US", "1.5", 1);
  auto c = emugpu::resolve_config({}, "");
  EXPECT_EQ(c.net_gbps, 50);
  EXPECT_EQ(c.net_latency_us, 1.5);
  ConfigRequest r;
  r.net_gbps = 400;
  r.net_latency_us = 0;
  c = emugpu::resolve_config(r, "");
  EXPECT_EQ(c.net_gbps, 400);
  EXPECT_EQ(c.net_latency_us, 0);
  r.net_gbps = -1;
  EXPECT_THROW(emugpu::resolve_config(r, ""), emugpu::Error);
}

TEST_F(CleanEnvironment, HostCopyRateComesFromTheEnvironmentAndIsChecked) {
  EXPECT_EQ(emugpu::resolve_config({}, "").host_copy_gbps, emugpu::kDefaultHostCopyGBps);
  setenv("EMUGPU_HOST_COPY_GBPS", "8.5", 1);
  EXPECT_EQ(emugpu::resolve_config({}, "").host_copy_gbps, 8.5);
  for (const char* bad : {"0", "-1", "quick", "inf"}) {
    setenv("EMUGPU_HOST_COPY_GBPS", bad, 1);
    try {
      emugpu::resolve_config({}, "");
      ADD_FAILURE() << bad << " was accepted";
    } catch (const emugpu::Error& e) {
      EXPECT_NE(std::string(e.what()).find("EMUGPU_HOST_COPY_GBPS"), std::string::npos) << e.what();
    }
  }
  unsetenv("EMUGPU_HOST_COPY_GBPS");
}

TEST_F(CleanEnvironment, TheEmulatedHostsTimePerOpComesFromTheEnvironmentAndIsChecked) {
  EXPECT_EQ(emugpu::resolve_config({}, "").host_op_us, 0);
  setenv("EMUGPU_HOST_OP_US", "62.5", 1);
  EXPECT_EQ(emugpu::resolve_config({}, "").host_op_us, 62.5);
  for (const char* bad : {"-1", "slow", "nan", "1e7"}) {
    setenv("EMUGPU_HOST_OP_US", bad, 1);
    try {
      emugpu::resolve_config({}, "");
      ADD_FAILURE() << bad << " was accepted";
    } catch (const emugpu::Error& e) {
      EXPECT_NE(std::string(e.what()).find("EMUGPU_HOST_OP_US"), std::string::npos) << e.what();
    }
  }
  unsetenv("EMUGPU_HOST_OP_US");
}

TEST_F(CleanEnvironment, BadNetworkValuesNameTheirSource) {
  for (const char* bad : {"0", "-5", "fast", "nan", "inf", "1e9", "12GB", "1e999"}) {
    setenv("EMUGPU_NET_GBPS", bad, 1);
    try {
      emugpu::resolve_config({}, "");
      ADD_FAILURE() << bad << " was accepted";
    } catch (const emugpu::Error& e) {
      EXPECT_EQ(e.kind(), emugpu::ErrorKind::kValue);
      EXPECT_NE(std::string(e.what()).find("EMUGPU_NET_GBPS"), std::string::npos) << e.what();
    }
  }
  unsetenv("EMUGPU_NET_GBPS");
  for (const char* bad : {"-1", "soon", "2e6", "nan"}) {
    setenv("EMUGPU_NET_LATENCY_US", bad, 1);
    try {
      emugpu::resolve_config({}, "");
      ADD_FAILURE() << bad << " was accepted";
    } catch (const emugpu::Error& e) {
      EXPECT_NE(std::string(e.what()).find("EMUGPU_NET_LATENCY_US"), std::string::npos) << e.what();
    }
  }
}

TEST_F(CleanEnvironment, TheEnvironmentFillsWhatTheCallerLeavesOut) {
  setenv("EMUGPU_GPU", " v100 ", 1);
  setenv("EMUGPU_DEVICE_COUNT", "4", 1);
  setenv("EMUGPU_MODE", "Compute", 1);
  setenv("EMUGPU_CATALOG", "/y.json", 1);
  auto c = emugpu::resolve_config({}, "/x.json");
  EXPECT_EQ(c.gpu, "v100");
  EXPECT_EQ(c.device_count, 4);
  EXPECT_EQ(c.mode, Mode::kCompute);
  EXPECT_EQ(c.catalog_path, "/y.json");
  c = emugpu::resolve_config({std::string("t4"), 2, std::string("timing"), std::nullopt, std::nullopt, std::nullopt,
                              std::nullopt, std::nullopt},
                             "/x.json");
  EXPECT_EQ(c.gpu, "t4");
  EXPECT_EQ(c.device_count, 2);
  EXPECT_EQ(c.mode, Mode::kTiming);
}

TEST_F(CleanEnvironment, TheExchangeTransportComesFromTheEnvironment) {
  EXPECT_EQ(emugpu::resolve_config({}, "").exchange, emugpu::ExchangeTransport::kAuto);
  setenv("EMUGPU_EXCHANGE", " TCP", 1);
  EXPECT_EQ(emugpu::resolve_config({}, "").exchange, emugpu::ExchangeTransport::kTcp);
  setenv("EMUGPU_EXCHANGE", "shm", 1);
  EXPECT_EQ(emugpu::resolve_config({}, "").exchange, emugpu::ExchangeTransport::kShm);
  setenv("EMUGPU_EXCHANGE", "gloo", 1);
  try {
    emugpu::resolve_config({}, "");
    ADD_FAILURE() << "gloo was accepted";
  } catch (const emugpu::Error& e) {
    EXPECT_NE(std::string(e.what()).find("EMUGPU_EXCHANGE: expected one of auto, tcp, shm, got 'gloo'"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(CleanEnvironment, BadValuesNameTheirSource) {
  for (const char* bad : {"0", "-2", "two", "1.5", "65", "99999999999999999999"}) {
    setenv("EMUGPU_DEVICE_COUNT", bad, 1);
    try {
      emugpu::resolve_config({}, "");
      ADD_FAILURE() << bad << " was accepted";
    } catch (const emugpu::Error& e) {
      EXPECT_EQ(e.kind(), emugpu::ErrorKind::kValue);
      EXPECT_NE(std::string(e.what()).find("EMUGPU_DEVICE_COUNT"), std::string::npos) << e.what();
    }
  }
  unsetenv("EMUGPU_DEVICE_COUNT");
  setenv("EMUGPU_MODE", "fast", 1);
  EXPECT_THROW(emugpu::resolve_config({}, ""), emugpu::Error);
  setenv("EMUGPU_MODE", std::string(10000, 'x').c_str(), 1);
  try {
    emugpu::resolve_config({}, "");
    ADD_FAILURE() << "a 10000-character mode was accepted";
  } catch (const emugpu::Error& e) {
    EXPECT_LT(std::string(e.what()).size(), 200u);  // the echo is bounded
  }
  unsetenv("EMUGPU_MODE");
  EXPECT_THROW(
      emugpu::resolve_config(
          {std::nullopt, 0, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt}, ""),
      emugpu::Error);
}

}  // namespace

TEST_F(CleanEnvironment, SearchPathPutsTheEnvironmentThenTheUserThenThePackage) {
  setenv("EMUGPU_PROFILE_PATH", "/a: ::/b c", 1);  // blank parts are skipped; spaces inside a name are kept
  setenv("XDG_DATA_HOME", "/x", 1);
  const auto path = emugpu::resolve_search_path("/pkg/profiles");
  const std::vector<std::string> want{"/a", "/b c", "/x/torch-emugpu/profiles", "/pkg/profiles"};
  EXPECT_EQ(path.profiles, want);
  EXPECT_EQ(path.calibration, want);
}

TEST_F(CleanEnvironment, SearchPathFallsBackToTheHomesDataDirectory) {
  const char* saved = std::getenv("HOME");
  const std::string home = saved != nullptr ? saved : "";
  setenv("HOME", "/home/u", 1);
  const auto path = emugpu::resolve_search_path("/pkg");
  if (saved != nullptr) {
    setenv("HOME", home.c_str(), 1);
  } else {
    unsetenv("HOME");
  }
  EXPECT_EQ(path.profiles, (std::vector<std::string>{"/home/u/.local/share/torch-emugpu/profiles", "/pkg"}));
}

TEST_F(CleanEnvironment, SearchPathSwitchesTurnProfilesAndCalibrationOffApart) {
  setenv("EMUGPU_PROFILES", " OFF ", 1);
  auto path = emugpu::resolve_search_path("/pkg");
  EXPECT_TRUE(path.profiles.empty());
  EXPECT_EQ(path.calibration.back(), "/pkg");  // a calibration belongs to the cost model, not to a profile
  setenv("EMUGPU_PROFILES", "on", 1);
  setenv("EMUGPU_CALIBRATION", "off", 1);
  path = emugpu::resolve_search_path("/pkg");
  EXPECT_EQ(path.profiles.back(), "/pkg");
  EXPECT_TRUE(path.calibration.empty());
  setenv("EMUGPU_PROFILES", "maybe", 1);
  try {
    emugpu::resolve_search_path("/pkg");
    FAIL() << "expected a refusal";
  } catch (const emugpu::Error& e) {
    EXPECT_NE(std::string(e.what()).find("EMUGPU_PROFILES: expected 'on' or 'off', got 'maybe'"), std::string::npos)
        << e.what();
  }
}

namespace {

using emugpu::ConfigRequest;

TEST_F(CleanEnvironment, TheClockIsRealUnlessAskedForVirtual) {
  auto c = emugpu::resolve_config({}, "/x/gpus.json");
  EXPECT_EQ(c.clock, emugpu::ClockKind::kReal);
  EXPECT_EQ(c.host, emugpu::HostModel::kMeasured);
  EXPECT_EQ(c.host_speed, 1.0);
  setenv("EMUGPU_CLOCK", " Virtual ", 1);
  setenv("EMUGPU_HOST", "modelled", 1);
  setenv("EMUGPU_HOST_SPEED", "2.5", 1);
  c = emugpu::resolve_config({}, "/x/gpus.json");
  EXPECT_EQ(c.clock, emugpu::ClockKind::kVirtual);
  EXPECT_EQ(c.host, emugpu::HostModel::kModelled);
  EXPECT_EQ(c.host_speed, 2.5);
  ConfigRequest r;
  r.clock = "real";
  r.host = "measured";
  r.host_speed = 0.5;
  c = emugpu::resolve_config(r, "/x/gpus.json");  // explicit values win over the environment
  EXPECT_EQ(c.clock, emugpu::ClockKind::kReal);
  EXPECT_EQ(c.host, emugpu::HostModel::kMeasured);
  EXPECT_EQ(c.host_speed, 0.5);
}

TEST_F(CleanEnvironment, AHostCostFilePricesOnlyTheModelledHostAndNotBesideAPerOpTime) {
  setenv("EMUGPU_HOST_COST", " /data/host_cost.json ", 1);
  auto failure = [] {
    try {
      emugpu::resolve_config({}, "/x/gpus.json");
    } catch (const emugpu::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string measured = failure();  // the real clock: nothing to price
  EXPECT_NE(measured.find("expected EMUGPU_CLOCK=virtual and EMUGPU_HOST=modelled with it, got clock real"),
            std::string::npos)
      << measured;
  setenv("EMUGPU_CLOCK", "virtual", 1);
  setenv("EMUGPU_HOST", "modelled", 1);
  EXPECT_EQ(emugpu::resolve_config({}, "/x/gpus.json").host_cost_file, "/data/host_cost.json");
  setenv("EMUGPU_HOST_OP_US", "30", 1);
  const std::string both = failure();
  EXPECT_NE(both.find("expected one of them, got both"), std::string::npos) << both;
}

TEST_F(CleanEnvironment, UnknownClockAndHostValuesListTheValidOnes) {
  auto message = [](const char* var, const char* value) {
    setenv(var, value, 1);
    std::string what;
    try {
      emugpu::resolve_config({}, "/x/gpus.json");
    } catch (const emugpu::Error& e) {
      what = e.what();
    }
    unsetenv(var);
    return what;
  };
  const std::string clock = message("EMUGPU_CLOCK", "simulated");
  EXPECT_NE(clock.find("EMUGPU_CLOCK: expected one of real, virtual, got 'simulated'"), std::string::npos) << clock;
  const std::string host = message("EMUGPU_HOST", "guess");
  EXPECT_NE(host.find("EMUGPU_HOST: expected one of measured, modelled, got 'guess'"), std::string::npos) << host;
  for (const char* bad : {"0", "-1", "nan", "1e9", "fast"}) {
    const std::string speed = message("EMUGPU_HOST_SPEED", bad);
    EXPECT_NE(speed.find("EMUGPU_HOST_SPEED"), std::string::npos) << bad << ": " << speed;
  }
}

}  // namespace
