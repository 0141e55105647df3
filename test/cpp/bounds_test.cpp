// Bad input at the edges: every configured number within physical bounds
// (with the range in the error), durations from rates that saturate instead
// of wrapping, and echoed user strings cut short.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <limits>
#include <string>

#include "catalog.h"
#include "clock.h"
#include "collective_cost.h"
#include "config.h"
#include "cost_model.h"
#include "error.h"
#include "test_gpu.h"

namespace {

// One valid GPU entry with `field` set to `value` (JSON text).
std::string catalog_with(const std::string& field, const std::string& value) {
  std::string text = R"({"gpus": [{"name": "Test GPU", "memory_gib": 16, "sm_count": 80,
    "compute_capability": "7.0", "fp32_tflops": 15.7, "memory_bandwidth_gbps": 900,
    "pcie_generation": 3, "pcie_width": 16)";
  return text + ", \"" + field + "\": " + value + "}]}";
}

std::string catalog_error(const std::string& text) {
  try {
    emugpu::Catalog::from_json_text(text, "x.json");
  } catch (const emugpu::Error& e) {
    EXPECT_EQ(e.kind(), emugpu::ErrorKind::kValue);
    return e.what();
  }
  return "";
}

TEST(CatalogBounds, AbsurdlySmallRatesAreRefusedWithTheValidRange) {
  struct Case {
    const char* field;
    const char* value;
    const char* range;
  };
  for (const Case& c :
       {Case{"memory_bandwidth_gbps", "1e-15", ">= 1 and <= 100000"},
        Case{"fp32_tflops", "5e-324", ">= 0.01 and <= 1000000"}, Case{"fp16_tflops", "1e-9", ">= 0.01 and <= 1000000"},
        Case{"fp64_tflops", "0.001", ">= 0.01 and <= 1000000"}, Case{"nvlink_gbps", "0.5", ">= 1 and <= 100000"},
        Case{"memory_gib", "1e-6", ">= 0.125 and <= 16384"}}) {
    const std::string msg = catalog_error(catalog_with(c.field, c.value));
    EXPECT_NE(msg.find(std::string("field '") + c.field + "'"), std::string::npos) << c.field << ": " << msg;
    EXPECT_NE(msg.find(c.range), std::string::npos) << c.field << ": " << msg;
    EXPECT_NE(msg.find("x.json"), std::string::npos) << msg;
  }
}

TEST(CatalogBounds, AbsurdlyLargeBandwidthIsRefused) {
  const std::string msg = catalog_error(catalog_with("memory_bandwidth_gbps", "200000"));
  EXPECT_NE(msg.find("<= 100000"), std::string::npos) << msg;
}

TEST(CatalogBounds, OptionalRatesMayStillBeZeroForNotPublished) {
  const auto c = emugpu::Catalog::from_json_text(catalog_with("fp64_tflops", "0"), "x.json");
  EXPECT_EQ(c.gpus().at(0).fp64_flops, 0);
  EXPECT_EQ(c.gpus().at(0).peak_flops(emugpu::DType::kFloat64), c.gpus().at(0).fp32_flops / 32);
}

TEST(CatalogBounds, TheShippedCatalogFitsTheBounds) {
  const auto c = emugpu::Catalog::from_file(EMUGPU_CATALOG_PATH);
  EXPECT_GT(c.gpus().size(), 10u);
}

TEST(EchoInput, AHugeGpuNameIsCutInTheErrorAndFoundQuickly) {
  const auto c = emugpu::Catalog::from_file(EMUGPU_CATALOG_PATH);
  const std::string name(100'000, 'x');
  const auto start = std::chrono::steady_clock::now();
  try {
    c.find(name);
    FAIL() << "a 100 kB name matched a GPU";
  } catch (const emugpu::Error& e) {
    const std::string msg = e.what();
    EXPECT_LT(msg.size(), 2000u) << msg.substr(0, 300);
    EXPECT_NE(msg.find(std::string(80, 'x') + "... (100000 bytes)"), std::string::npos) << msg.substr(0, 300);
    EXPECT_NE(msg.find("Known GPUs"), std::string::npos);
  }
  // An edit distance against every name would take 100000 x 20 steps each.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(200));
}

TEST(EchoInput, ShortTextIsKeptAndLongTextCutAtACharacterBoundary) {
  EXPECT_EQ(emugpu::echo_input("v100"), "v100");
  std::string accents;
  for (int i = 0; i < 100; ++i) accents += "\xc3\xa9";  // 200 bytes, 2 per character
  const std::string cut = emugpu::echo_input(accents);
  EXPECT_EQ(cut, accents.substr(0, 80) + "... (200 bytes)");
  EXPECT_EQ(emugpu::echo_input(std::string(81, 'a')), std::string(80, 'a') + "... (81 bytes)");
}

TEST(EchoInput, InvalidUtf8BecomesEscapes) {
  EXPECT_EQ(emugpu::valid_utf8("a\xff"
                               "b"),
            "a\\xffb");
  EXPECT_EQ(emugpu::valid_utf8("\xc3"), "\\xc3");                    // truncated sequence
  EXPECT_EQ(emugpu::valid_utf8("\xc0\xaf"), "\\xc0\\xaf");           // overlong '/'
  EXPECT_EQ(emugpu::valid_utf8("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
  EXPECT_EQ(emugpu::valid_utf8("\xe2\x82\xac \xf0\x9f\x98\x80"), "\xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(emugpu::echo_input("gpu\xfe"), "gpu\\xfe");
}

struct RateEnvironment : ::testing::Test {
  static constexpr const char* kNames[] = {"EMUGPU_NET_GBPS",         "EMUGPU_NET_LATENCY_US", "EMUGPU_HOST_COPY_GBPS",
                                           "EMUGPU_PCIE_UPLINK_GBPS", "EMUGPU_PCIE_SHARED_BY", "EMUGPU_GPU"};
  void SetUp() override {
    for (const char* v : kNames) unsetenv(v);
  }
  void TearDown() override { SetUp(); }

  static std::string config_error() {
    try {
      emugpu::resolve_config({}, "");
    } catch (const emugpu::Error& e) {
      EXPECT_EQ(e.kind(), emugpu::ErrorKind::kValue);
      return e.what();
    }
    return "";
  }
};

TEST_F(RateEnvironment, TinyOrHugeRatesAreRefusedWithTheValidRange) {
  struct Case {
    const char* name;
    const char* value;
    const char* range;
  };
  for (const Case& c : {Case{"EMUGPU_NET_GBPS", "1e-30", "from 0.001 to 100000"},
                        Case{"EMUGPU_NET_GBPS", "0.0001", "from 0.001 to 100000"},
                        Case{"EMUGPU_HOST_COPY_GBPS", "1e-30", "from 0.001 to 10000"},
                        Case{"EMUGPU_HOST_COPY_GBPS", "50000", "from 0.001 to 10000"},
                        Case{"EMUGPU_PCIE_UPLINK_GBPS", "1e-12", "from 0.001 to 10000"},
                        Case{"EMUGPU_PCIE_UPLINK_GBPS", "1e9", "from 0.001 to 10000"},
                        Case{"EMUGPU_NET_LATENCY_US", "1e7", "from 0 to 1000000"}}) {
    setenv(c.name, c.value, 1);
    const std::string msg = config_error();
    EXPECT_NE(msg.find(c.name), std::string::npos) << c.name << "=" << c.value << ": " << msg;
    EXPECT_NE(msg.find(c.range), std::string::npos) << c.name << "=" << c.value << ": " << msg;
    unsetenv(c.name);
  }
  emugpu::ConfigRequest r;
  r.net_gbps = 1e-30;
  try {
    emugpu::resolve_config(r, "");
    ADD_FAILURE() << "net_gbps = 1e-30 was accepted";
  } catch (const emugpu::Error& e) {
    EXPECT_NE(std::string(e.what()).find("from 0.001"), std::string::npos) << e.what();
  }
}

TEST_F(RateEnvironment, SlowRatesThatTestsUseStayValid) {
  setenv("EMUGPU_NET_GBPS", "0.1", 1);
  setenv("EMUGPU_PCIE_UPLINK_GBPS", "0.005", 1);
  setenv("EMUGPU_HOST_COPY_GBPS", "0.5", 1);
  const auto c = emugpu::resolve_config({}, "");
  EXPECT_EQ(c.net_gbps, 0.1);
  EXPECT_EQ(c.pcie_uplink_gbps, 0.005);
  EXPECT_EQ(c.host_copy_gbps, 0.5);
}

TEST_F(RateEnvironment, AHugeValueIsCutInTheError) {
  setenv("EMUGPU_PCIE_SHARED_BY", std::string(100'000, '9').c_str(), 1);
  const std::string msg = config_error();
  EXPECT_LT(msg.size(), 400u) << msg.substr(0, 300);
  EXPECT_NE(msg.find("... (100000 bytes)"), std::string::npos) << msg.substr(0, 300);
}

TEST(SaturatedDurations, ConversionSaturatesInsteadOfWrapping) {
  EXPECT_EQ(emugpu::ns_from_double(1.4), 1);
  EXPECT_EQ(emugpu::ns_from_double(1e40), emugpu::kMaxDurationNs);
  EXPECT_EQ(emugpu::ns_from_double(std::numeric_limits<double>::infinity()), emugpu::kMaxDurationNs);
  EXPECT_THROW(emugpu::ns_from_double(std::numeric_limits<double>::quiet_NaN()), emugpu::Error);
  EXPECT_THROW(emugpu::ns_from_double(-1), emugpu::Error);
  constexpr auto kMax = std::numeric_limits<emugpu::TimeNs>::max();
  EXPECT_EQ(emugpu::add_saturating(kMax - 1, 5), kMax);
  EXPECT_EQ(emugpu::add_saturating(3, 4), 7);
}

TEST(SaturatedDurations, AnInterNodeCollectiveOverATinyNetworkTakesTheLongestDuration) {
  emugpu::GpuSpec gpu = emugpu::testing::test_gpu();
  gpu.nvlink_bandwidth = 300e9;
  // 1e-30 GB/s, as EMUGPU_NET_GBPS=1e-30 once passed validation; the core
  // must not wrap even where a caller hands it such a rate directly.
  for (double bandwidth : {1e-21, emugpu::kMinRateGBps * 1e9}) {
    const auto topo = emugpu::make_topology(gpu, 16, 8, {bandwidth, 3.0});
    const auto cost = emugpu::collective_time(emugpu::Collective::kAllReduce, 1e12, topo);
    EXPECT_GT(cost.duration, 0) << bandwidth;
    EXPECT_LE(cost.duration, emugpu::kMaxDurationNs) << bandwidth;
  }
  const auto tiny = emugpu::make_topology(gpu, 16, 8, {1e-21, 3.0});
  EXPECT_EQ(emugpu::collective_time(emugpu::Collective::kAllReduce, 1e9, tiny).duration, emugpu::kMaxDurationNs);
}

TEST(SaturatedDurations, AHugeTransferOverATinyMeasuredRateSaturates) {
  emugpu::CostModel model(emugpu::testing::test_gpu());
  model.set_measured_transfer(1000, 1e-9, 0);
  // The longest duration, plus the copy's latency: never wrapped below zero.
  EXPECT_EQ(model.transfer(1e18, false), emugpu::kMaxDurationNs + 1000);
  EXPECT_EQ(model.transfer(1e18, true), emugpu::kMaxDurationNs + 1000);
}

TEST(SaturatedDurations, TheTimelineSaturatesInsteadOfWrapping) {
  emugpu::Timeline timeline;
  emugpu::TimeNs end = 0;
  for (int i = 0; i < 4; ++i) {
    end = timeline.place(0, emugpu::Engine::kCompute, timeline.start_of(0, emugpu::Engine::kCompute, 0),
                         emugpu::kMaxDurationNs, 0);
    EXPECT_GT(end, 0) << i;
  }
  EXPECT_EQ(end, std::numeric_limits<emugpu::TimeNs>::max());
  EXPECT_GT(timeline.engine_stats(emugpu::Engine::kCompute).busy_ns, 0);
}

}  // namespace
