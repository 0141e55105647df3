#include "catalog.h"

#include <gtest/gtest.h>

#include "error.h"

namespace {

const emugpu::Catalog& catalog() {
  static const emugpu::Catalog c = emugpu::Catalog::from_file(EMUGPU_CATALOG_PATH);
  return c;
}

TEST(Catalog, FindsNamesSpelledTheWayToolsPrintThem) {
  EXPECT_EQ(catalog().find("v100").name, "Tesla V100-SXM2-16GB");
  EXPECT_EQ(catalog().find("V100-PCIE-32GB").name, "Tesla V100-PCIE-32GB");
  EXPECT_EQ(catalog().find("Tesla V100-PCIE-32GB").name, "Tesla V100-PCIE-32GB");
  EXPECT_EQ(catalog().find("Tesla_V100-PCIE-32GB").name, "Tesla V100-PCIE-32GB");
  EXPECT_EQ(catalog().find("NVIDIA_A100-SXM4-40GB").name, "NVIDIA A100-SXM4-40GB");
  EXPECT_EQ(catalog().find("Quadro_RTX_6000").name, "Quadro RTX 6000");
  EXPECT_EQ(catalog().find("H100-SXM").name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(catalog().find("Tesla_K80").name, "Tesla K80");
}

TEST(Catalog, CoversTheGpusTheIssueNames) {
  for (const char* name : {"K80", "M40", "P100-16GB", "V100-16GB", "V100-32GB", "T4", "RTX 6000",
                           "A10", "A100-40GB", "A100-80GB", "L4", "H100-SXM", "H100-PCIe", "H200"}) {
    EXPECT_NO_THROW(catalog().find(name)) << name;
  }
}

TEST(Catalog, UnknownNameListsKnownOnesAndClosestMatch) {
  try {
    catalog().find("V101-PCIE-32GB");
    FAIL() << "expected an error";
  } catch (const emugpu::Error& e) {
    EXPECT_EQ(e.kind(), emugpu::ErrorKind::kValue);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("did you mean 'Tesla V100-PCIE-32GB'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("NVIDIA H200"), std::string::npos) << msg;
  }
}

TEST(Catalog, RejectsMalformedEntriesNamingTheField) {
  EXPECT_THROW(emugpu::Catalog::from_json_text("{", "x.json"), emugpu::Error);
  try {
    emugpu::Catalog::from_json_text(R"({"gpus": [{"name": "X", "memory_gib": "a lot"}]})", "x.json");
    FAIL() << "expected an error";
  } catch (const emugpu::Error& e) {
    EXPECT_NE(std::string(e.what()).find("memory_gib"), std::string::npos) << e.what();
  }
}

TEST(Catalog, PeakRatesFallBackToFp32WhereAGpuHasNoFasterPath) {
  const auto& k80 = catalog().find("k80");
  EXPECT_DOUBLE_EQ(k80.peak_flops(emugpu::DType::kFloat16), k80.fp32_flops);
  const auto& a100 = catalog().find("a100");
  EXPECT_GT(a100.peak_flops(emugpu::DType::kTensorFloat32), 7 * a100.fp32_flops);
  EXPECT_GT(catalog().find("h100").pcie_bandwidth(), 2 * catalog().find("v100").pcie_bandwidth());
}

TEST(Catalog, NormalizationDropsCaseSeparatorsAndVendor) {
  EXPECT_EQ(emugpu::normalize_gpu_name("Tesla_V100-PCIE-32GB"), "v100pcie32gb");
  EXPECT_EQ(emugpu::normalize_gpu_name("NVIDIA A10"), "a10");
  EXPECT_EQ(emugpu::edit_distance("kitten", "sitting"), 3u);
}

}  // namespace
