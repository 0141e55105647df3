#include "catalog.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

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
  for (const char* name : {"K80", "M40", "P100-16GB", "V100-16GB", "V100-32GB", "T4", "RTX 6000", "A10", "A100-40GB",
                           "A100-80GB", "L4", "H100-SXM", "H100-PCIe", "H200"}) {
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

// One GPU entry; `field` replaced by (or added with) `value`, as JSON text.
std::string catalog_with(const std::string& field = "", const std::string& value = "") {
  std::vector<std::pair<std::string, std::string>> fields = {{"name", R"("Test GPU")"},
                                                             {"aliases", R"(["tg"])"},
                                                             {"memory_gib", "16"},
                                                             {"sm_count", "80"},
                                                             {"compute_capability", R"("7.0")"},
                                                             {"fp32_tflops", "15.7"},
                                                             {"fp16_tflops", "125"},
                                                             {"memory_bandwidth_gbps", "900"},
                                                             {"pcie_generation", "3"},
                                                             {"pcie_width", "16"},
                                                             {"nvlink_gbps", "150"}};
  bool replaced = false;
  for (auto& [k, v] : fields) {
    if (k == field) v = value, replaced = true;
  }
  if (!field.empty() && !replaced) fields.emplace_back(field, value);
  std::string text = R"({"gpus": [{)";
  for (size_t i = 0; i < fields.size(); ++i) {
    text += (i ? ", \"" : "\"") + fields[i].first + "\": " + fields[i].second;
  }
  return text + "}]}";
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

TEST(CatalogLimits, ValidEntryParsesWithIntegralFloatsAsIntegers) {
  const auto c = emugpu::Catalog::from_json_text(catalog_with("sm_count", "80.0"), "x.json");
  const auto& g = c.find("tg");
  EXPECT_EQ(g.sm_count, 80);
  EXPECT_EQ(g.major, 7);
  EXPECT_EQ(g.memory_bytes, 16ull << 30);
  EXPECT_DOUBLE_EQ(g.nvlink_bandwidth, 150e9);
}

TEST(CatalogLimits, DeeplyNestedDocumentsAreRefusedNamingTheFile) {
  const std::string deep(100000, '[');
  for (const std::string& text :
       {deep, catalog_with("memory_gib", deep + std::string(100000, ']')), catalog_with("aliases", deep)}) {
    const std::string msg = catalog_error(text);
    EXPECT_NE(msg.find("x.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("deeper than 64 levels"), std::string::npos) << msg;
  }
  // The field sits 3 levels down: 61 more make the 64 allowed, 62 one too many.
  const std::string at_limit = std::string(61, '[') + std::string(61, ']');
  const std::string msg = catalog_error(catalog_with("memory_gib", at_limit));
  EXPECT_NE(msg.find("field 'memory_gib'"), std::string::npos) << msg;
  EXPECT_LT(msg.size(), 300u) << msg;
  const std::string beyond = std::string(62, '[') + std::string(62, ']');
  EXPECT_NE(catalog_error(catalog_with("memory_gib", beyond)).find("deeper than 64"), std::string::npos);
}

TEST(CatalogLimits, OutOfRangeAndWronglyTypedFieldsNameTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {{"memory_gib", "-1"},
                                                                  {"memory_gib", "0"},
                                                                  {"memory_gib", "16385"},
                                                                  {"memory_gib", "1e300"},
                                                                  {"sm_count", "1.5"},
                                                                  {"sm_count", "0"},
                                                                  {"sm_count", "10001"},
                                                                  {"sm_count", "1e300"},
                                                                  {"sm_count", "-1e300"},
                                                                  {"sm_count", "18446744073709551615"},
                                                                  {"sm_count", R"("80")"},
                                                                  {"compute_capability", R"("99999999999999999999.0")"},
                                                                  {"compute_capability", R"("7.0abc")"},
                                                                  {"compute_capability", R"("100.0")"},
                                                                  {"compute_capability", "7.0"},
                                                                  {"fp32_tflops", "0"},
                                                                  {"fp32_tflops", "1e7"},
                                                                  {"fp16_tflops", "-1"},
                                                                  {"bf16_tflops", R"("fast")"},
                                                                  {"memory_bandwidth_gbps", "2e6"},
                                                                  {"pcie_generation", "7"},
                                                                  {"pcie_generation", "3.5"},
                                                                  {"pcie_width", "0"},
                                                                  {"pcie_width", "64"},
                                                                  {"nvlink_gbps", "-5"},
                                                                  {"nvlink_gbps", "1e9"},
                                                                  {"aliases", "[1]"},
                                                                  {"aliases", R"("tg")"},
                                                                  {"name", "42"}};
  for (const auto& [field, value] : cases) {
    const std::string msg = catalog_error(catalog_with(field, value));
    EXPECT_NE(msg.find("field '" + field), std::string::npos) << field << " = " << value << ": " << msg;
    EXPECT_NE(msg.find("x.json"), std::string::npos) << msg;
  }
  EXPECT_NE(catalog_error(catalog_with("memory_gib", "-1")).find("<= 16384"), std::string::npos);
  EXPECT_NE(catalog_error(catalog_with("fp32_tflops", "1e7")).find("1e18 FLOP/s"), std::string::npos);
}

TEST(CatalogLimits, NumbersTooLargeForADoubleAreRefusedAsInvalidJson) {
  const std::string msg = catalog_error(catalog_with("memory_gib", "1e400"));
  EXPECT_NE(msg.find("x.json: not valid JSON"), std::string::npos) << msg;
}

TEST(CatalogLimits, NonObjectEntriesAreRefused) {
  const std::string msg = catalog_error(R"({"gpus": [[1, 2, 3]]})");
  EXPECT_NE(msg.find("gpus[0]: expected an object"), std::string::npos) << msg;
}

TEST(DescribeJson, StaysShortAndShallow) {
  using nlohmann::json;
  const std::string huge(100000, 'x');
  EXPECT_LE(emugpu::describe_json(json(huge)).size(), 80u);
  EXPECT_EQ(emugpu::describe_json(json::parse("[1, [2, [3]], {}]")), "[1, [...], {}]");
  EXPECT_EQ(emugpu::describe_json(json::parse(R"({"a": {"b": 1}})")), R"({"a": {...}})");
  json many = json::array();
  for (int i = 0; i < 1000; ++i) many.push_back(i);
  const std::string text = emugpu::describe_json(many);
  EXPECT_LT(text.size(), 120u) << text;
  EXPECT_NE(text.find("an array of 1000 elements"), std::string::npos) << text;
  // Cut strings stay valid UTF-8 (messages reach Python).
  std::string accents;
  for (int i = 0; i < 100; ++i) accents += "\xc3\xa9";
  const std::string cut = emugpu::describe_json(json(accents));
  EXPECT_NO_THROW((void)json(cut).dump()) << cut;
}

TEST(JsonIntegerIn, RefusesFractionsAndRangesWithoutCasting) {
  using nlohmann::json;
  EXPECT_EQ(emugpu::json_integer_in(json(3.0), 1, 10), 3);
  EXPECT_EQ(emugpu::json_integer_in(json(7), 1, 10), 7);
  EXPECT_FALSE(emugpu::json_integer_in(json(1.5), 1, 10));
  EXPECT_FALSE(emugpu::json_integer_in(json(1e300), 1, 10));
  EXPECT_FALSE(emugpu::json_integer_in(json(-1e300), 1, 10));
  EXPECT_FALSE(emugpu::json_integer_in(json(UINT64_MAX), 1, 10));
  EXPECT_FALSE(emugpu::json_integer_in(json(-3), 1, 10));
  EXPECT_FALSE(emugpu::json_integer_in(json("3"), 1, 10));
}

}  // namespace
