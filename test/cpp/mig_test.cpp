#include "mig.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "catalog.h"
#include "error.h"

namespace {

const emugpu::Catalog& catalog() {
  static const emugpu::Catalog c = emugpu::Catalog::from_file(EMUGPU_CATALOG_PATH);
  return c;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const emugpu::Error& e) {
    EXPECT_EQ(e.kind(), emugpu::ErrorKind::kValue);
    return e.what();
  }
  ADD_FAILURE() << "expected an emugpu::Error";
  return "";
}

TEST(Mig, CatalogHasThePublishedSmCountsPerProfile) {
  const auto& h100 = catalog().find("h100-sxm");
  std::vector<int> sms;
  for (const char* p : {"1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}) {
    sms.push_back(emugpu::find_mig_profile(h100, p).sm_count);
  }
  EXPECT_EQ(sms, (std::vector<int>{16, 32, 60, 64, 132}));
  const auto& a100 = catalog().find("a100");
  sms.clear();
  for (const char* p : {"1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}) {
    sms.push_back(emugpu::find_mig_profile(a100, p).sm_count);
  }
  EXPECT_EQ(sms, (std::vector<int>{14, 28, 42, 56, 98}));
}

TEST(Mig, PlacesALayoutTheDriverAccepts) {
  const auto& h100 = catalog().find("h100-sxm");
  // 3g must go to slice 4 so that the 2g and both 1g fit below it.
  const auto placed = emugpu::place_mig_layout(h100, {"1g.10gb", "3g.40gb", "2g.20gb", "1g.10gb"});
  ASSERT_EQ(placed.size(), 4u);
  EXPECT_EQ(placed[0].profile->name, "1g.10gb");  // the order asked for
  EXPECT_EQ(placed[1].profile->name, "3g.40gb");
  std::set<int> used;
  for (const auto& i : placed) {
    for (int s = i.start; s < i.start + i.profile->memory_slices; ++s) EXPECT_TRUE(used.insert(s).second) << s;
    EXPECT_NE(std::find(i.profile->placements.begin(), i.profile->placements.end(), i.start),
              i.profile->placements.end());
  }
  EXPECT_EQ(placed[1].start, 4);
}

TEST(Mig, RefusesALayoutThatDoesNotFitListingTheFullOnes) {
  const auto& h100 = catalog().find("h100-sxm");
  const std::string m = message_of([&] {
    emugpu::place_mig_layout(h100, {"4g.40gb", "4g.40gb"});
  });  // one placement only
  EXPECT_NE(m.find("does not fit on NVIDIA H100 80GB HBM3"), std::string::npos) << m;
  EXPECT_NE(m.find("4g.40gb,3g.40gb"), std::string::npos) << m;
  EXPECT_NE(m.find("7g.80gb"), std::string::npos) << m;
  // Eight 1g instances: only seven compute slices.
  EXPECT_THROW(emugpu::place_mig_layout(h100, std::vector<std::string>(8, "1g.10gb")), emugpu::Error);
  EXPECT_NO_THROW(emugpu::place_mig_layout(h100, std::vector<std::string>(7, "1g.10gb")));
  // 3g at 0 and 4g at 0 collide; 3g and 3g fit (0 and 4).
  EXPECT_THROW(emugpu::place_mig_layout(h100, {"4g.40gb", "3g.40gb", "1g.10gb"}), emugpu::Error);
  EXPECT_NO_THROW(emugpu::place_mig_layout(h100, {"3g.40gb", "3g.40gb"}));
}

TEST(Mig, UnknownProfileListsTheGpusProfiles) {
  const std::string m = message_of([&] { emugpu::place_mig_layout(catalog().find("a100"), {"1g.10gb", "5g.30gb"}); });
  EXPECT_NE(m.find("unknown MIG profile '5g.30gb'"), std::string::npos) << m;
  EXPECT_NE(m.find("1g.5gb, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb"), std::string::npos) << m;
  const std::string none = message_of([&] { emugpu::find_mig_profile(catalog().find("v100"), "1g.5gb"); });
  EXPECT_NE(none.find("has no MIG"), std::string::npos) << none;
}

TEST(Mig, FullLayoutsAreMaximalAndDistinct) {
  const auto& h100 = catalog().find("h100-sxm");
  const auto layouts = emugpu::full_mig_layouts(h100);
  const std::set<std::string> unique(layouts.begin(), layouts.end());
  EXPECT_EQ(unique.size(), layouts.size());
  EXPECT_EQ(layouts.front(), "7g.80gb");
  EXPECT_TRUE(unique.count("4g.40gb,3g.40gb"));
  EXPECT_TRUE(unique.count("1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb"));
  for (const std::string& layout : layouts) {
    const auto names = emugpu::parse_mig_layout(layout, "layout");
    EXPECT_NO_THROW(emugpu::place_mig_layout(h100, names)) << layout;
    for (const auto& p : h100.mig_profiles) {  // nothing can be added
      auto more = names;
      more.push_back(p.name);
      EXPECT_THROW(emugpu::place_mig_layout(h100, more), emugpu::Error) << layout << " + " << p.name;
    }
  }
}

TEST(Mig, InstanceSpecScalesRatesWithItsSlices) {
  const auto& h100 = catalog().find("h100-sxm");
  const auto placed = emugpu::place_mig_layout(h100, {"3g.40gb", "1g.10gb"});
  const emugpu::GpuSpec big = emugpu::mig_instance_spec(h100, placed[0]);
  const emugpu::GpuSpec small = emugpu::mig_instance_spec(h100, placed[1]);
  EXPECT_EQ(big.name, "NVIDIA H100 80GB HBM3 MIG 3g.40gb");
  EXPECT_EQ(big.parent_name, h100.name);
  EXPECT_EQ(small.mig_profile, "1g.10gb");
  EXPECT_EQ(big.sm_count, 60);
  EXPECT_DOUBLE_EQ(big.bf16_flops, h100.bf16_flops * 60 / 132);
  EXPECT_DOUBLE_EQ(big.memory_bandwidth, h100.memory_bandwidth * 4 / 8);
  EXPECT_DOUBLE_EQ(small.memory_bandwidth, h100.memory_bandwidth / 8);
  EXPECT_LT(small.memory_bytes, big.memory_bytes);
  EXPECT_NEAR(static_cast<double>(small.memory_bytes) / (1ull << 30), 9.75, 1e-6);
  EXPECT_TRUE(small.mig_profiles.empty());  // an instance is not divided again
  EXPECT_EQ(big.nvlink_bandwidth, 0);
}

TEST(Mig, UuidsAreStableAndDistinct) {
  const auto& h100 = catalog().find("h100-sxm");
  const auto placed = emugpu::place_mig_layout(h100, {"1g.10gb", "1g.10gb"});
  const std::string a = emugpu::mig_uuid(0, placed[0]);
  EXPECT_EQ(a, emugpu::mig_uuid(0, placed[0]));
  EXPECT_NE(a, emugpu::mig_uuid(0, placed[1]));
  EXPECT_NE(a, emugpu::mig_uuid(1, placed[0]));
  EXPECT_EQ(a.rfind("MIG-", 0), 0u);
  EXPECT_EQ(a.size(), 40u);  // MIG- and 36 of a UUID
}

TEST(Mig, ParsesLayoutsAsNvidiaSmiNamesThem) {
  EXPECT_EQ(emugpu::parse_mig_layout(" MIG 3g.40gb, 1g.10gb ", "EMUGPU_MIG"),
            (std::vector<std::string>{"3g.40gb", "1g.10gb"}));
  const std::string m = message_of([] { emugpu::parse_mig_layout("3g.40gb,,1g.10gb", "EMUGPU_MIG"); });
  EXPECT_NE(m.find("EMUGPU_MIG='3g.40gb,,1g.10gb'"), std::string::npos) << m;
}

TEST(Mig, CatalogRefusesAPlacementBeyondTheMemorySlices) {
  const std::string text = R"({"gpus": [{"name": "X", "memory_gib": 40, "sm_count": 100, "compute_capability": "8.0",
    "fp32_tflops": 19.5, "memory_bandwidth_gbps": 1555, "pcie_generation": 4, "pcie_width": 16,
    "mig": {"compute_slices": 7, "memory_slices": 8, "profiles": [
      {"name": "4g.20gb", "compute_slices": 4, "memory_slices": 4, "sm_count": 56, "memory_gib": 19.5, "placements": [0, 6]}]}}]})";
  const std::string m = message_of([&] { emugpu::Catalog::from_json_text(text, "test.json"); });
  EXPECT_NE(m.find("placements"), std::string::npos) << m;
  EXPECT_NE(m.find("from 0 to 4"), std::string::npos) << m;
}

}  // namespace
