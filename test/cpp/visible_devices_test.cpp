#include "visible_devices.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "error.h"

namespace {

// GPU 0 whole, GPU 1 split in three instances.
std::vector<emugpu::NodeDevice> node() {
  return {{0, -1, "", "A100"},
          {1, 0, "MIG-aaaa", "A100 MIG 3g.20gb"},
          {1, 1, "MIG-bbbb", "A100 MIG 2g.10gb"},
          {1, 2, "MIG-cccc", "A100 MIG 1g.5gb"}};
}

using Picked = std::vector<size_t>;

TEST(VisibleDevices, DefaultIsEveryWholeGpuAndTheFirstInstance) {
  EXPECT_EQ(emugpu::select_visible_devices(node(), "", "V"), (Picked{0, 1}));
}

TEST(VisibleDevices, SelectsByIndexPairOrUuidInTheOrderListed) {
  EXPECT_EQ(emugpu::select_visible_devices(node(), "MIG-cccc,0", "V"), (Picked{3, 0}));
  EXPECT_EQ(emugpu::select_visible_devices(node(), "1:1", "V"), (Picked{2}));
  EXPECT_EQ(emugpu::select_visible_devices(node(), "1", "V"), (Picked{1}));  // a MIG GPU: its first instance
}

TEST(VisibleDevices, AProcessEnumeratesOneMigInstanceAsCudaDoes) {
  EXPECT_EQ(emugpu::select_visible_devices(node(), "MIG-bbbb,MIG-aaaa,0", "V"), (Picked{2, 0}));
}

TEST(VisibleDevices, UnknownOrRepeatedEntriesAreErrorsListingTheNode) {
  try {
    emugpu::select_visible_devices(node(), "0,MIG-dddd", "EMUGPU_VISIBLE_DEVICES");
    FAIL() << "expected an error";
  } catch (const emugpu::Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.kind(), emugpu::ErrorKind::kValue);
    EXPECT_NE(m.find("EMUGPU_VISIBLE_DEVICES='0,MIG-dddd'"), std::string::npos) << m;
    EXPECT_NE(m.find("1:2 or MIG-cccc (A100 MIG 1g.5gb)"), std::string::npos) << m;
  }
  EXPECT_THROW(emugpu::select_visible_devices(node(), "0,0", "V"), emugpu::Error);
  EXPECT_THROW(emugpu::select_visible_devices(node(), "2", "V"), emugpu::Error);
  EXPECT_THROW(emugpu::select_visible_devices(node(), "1:x", "V"), emugpu::Error);
  EXPECT_THROW(emugpu::select_visible_devices(node(), "-1", "V"), emugpu::Error);
}

}  // namespace
