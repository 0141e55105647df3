#include "profile_db.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "error.h"

namespace {

using emugpu::LookupKind;

const char* kProfile = R"({
  "schema": "torch-emugpu profile v1",
  "gpu": "Tesla_V100-PCIE-32GB", "model": "resnet50",
  "fingerprint": {"parameters": 25557032},
  "provenance": {"tool": "test", "torch": "2.14.1", "dtype": "float32", "date": "2026-11-22", "source": "unit test"},
  "batches": [
    {"batch_size": 1, "forward_s": 0.010, "backward_s": 0.020, "peak_bytes": 100, "persistent_bytes": 50},
    {"batch_size": 16, "forward_s": 0.025, "backward_s": 0.050},
    {"batch_size": 32, "forward_s": 0.040, "backward_s": 0.090}
  ],
  "data_parallel": [{"gpu_count": 2, "batches": [{"batch_size": 32, "forward_s": 0.041, "backward_s": 0.1}]}]
})";

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  text.replace(text.find(from), from.size(), to);
  return text;
}

std::string error_of(const std::string& text) {
  try {
    emugpu::parse_profile(text, "p.json");
  } catch (const emugpu::Error& e) {
    return e.what();
  }
  return "";
}

TEST(ProfileDb, ParsesTablesFingerprintAndDataParallelEntries) {
  const auto p = emugpu::parse_profile(kProfile, "p.json");
  EXPECT_EQ(p.model, "resnet50");
  EXPECT_EQ(*p.parameters, 25557032);
  ASSERT_NE(p.table(1), nullptr);
  EXPECT_EQ(p.table(1)->points.size(), 3u);
  ASSERT_NE(p.table(2), nullptr);
  EXPECT_EQ(p.table(4), nullptr);
}

const char* kHost = R"("source": "unit test", "host": {"python_op_us": 5.5, "module_op_us": 7.25,
    "autograd_op_us": 3, "optimizer_param_us": 0.75, "module_ops": 12, "cpu": "AMD EPYC 9654",
    "cores": 16, "future_figure": {"any": ["shape"]}})";

TEST(ProfileDb, ParsesTheMeasuringHostsPerOpCosts) {
  const auto p = emugpu::parse_profile(replaced(kProfile, R"("source": "unit test")", kHost), "p.json");
  ASSERT_TRUE(p.host.has_value());
  EXPECT_DOUBLE_EQ(*p.host->python_op_us, 5.5);
  EXPECT_DOUBLE_EQ(*p.host->module_op_us, 7.25);
  EXPECT_DOUBLE_EQ(*p.host->autograd_op_us, 3.0);
  EXPECT_DOUBLE_EQ(*p.host->optimizer_param_us, 0.75);
  EXPECT_EQ(p.host->cpu, "AMD EPYC 9654");
  // Each figure is optional; so is the CPU's name.
  const auto partial = emugpu::parse_profile(
      replaced(kProfile, R"("source": "unit test")", R"("source": "s", "host": {"autograd_op_us": 4, "cpu": null})"),
      "p.json");
  ASSERT_TRUE(partial.host.has_value());
  EXPECT_FALSE(partial.host->python_op_us.has_value());
  EXPECT_DOUBLE_EQ(*partial.host->autograd_op_us, 4.0);
  EXPECT_EQ(partial.host->cpu, "");
}

TEST(ProfileDb, ProfilesWithoutAHostStillParse) {
  EXPECT_FALSE(emugpu::parse_profile(kProfile, "p.json").host.has_value());
  const auto null_host =
      emugpu::parse_profile(replaced(kProfile, R"("source": "unit test")", R"("source": "s", "host": null)"), "p.json");
  EXPECT_FALSE(null_host.host.has_value());
}

TEST(ProfileDb, BadHostFiguresAreRefusedNamingTheField) {
  const std::string with_host = replaced(kProfile, R"("source": "unit test")", kHost);
  const std::vector<std::pair<std::pair<std::string, std::string>, std::string>> cases = {
      {{R"("python_op_us": 5.5)", R"("python_op_us": -1)"}, "provenance.host.python_op_us"},
      {{R"("module_op_us": 7.25)", R"("module_op_us": "NaN")"}, "provenance.host.module_op_us"},
      {{R"("autograd_op_us": 3)", R"("autograd_op_us": 2e6)"}, "provenance.host.autograd_op_us"},
      {{R"("optimizer_param_us": 0.75)", R"("optimizer_param_us": true)"}, "provenance.host.optimizer_param_us"},
      {{R"("cpu": "AMD EPYC 9654")", R"("cpu": 9654)"}, "provenance.host.cpu"},
  };
  for (const auto& [edit, field] : cases) {
    const std::string msg = error_of(replaced(with_host, edit.first, edit.second));
    EXPECT_NE(msg.find("profile p.json: field '" + field + "'"), std::string::npos) << edit.second << ": " << msg;
  }
  const std::string negative = error_of(replaced(with_host, R"("python_op_us": 5.5)", R"("python_op_us": -1)"));
  EXPECT_NE(negative.find("expected a number of microseconds >= 0 and <= 1e6"), std::string::npos) << negative;
  EXPECT_NE(negative.find("got -1"), std::string::npos) << negative;
  const std::string nan = error_of(replaced(with_host, R"("module_op_us": 7.25)", R"("module_op_us": "NaN")"));
  EXPECT_NE(nan.find(R"(got "NaN")"), std::string::npos) << nan;
  const std::string not_object =
      error_of(replaced(kProfile, R"("source": "unit test")", R"("source": "s", "host": "gpu-box-7")"));
  EXPECT_NE(not_object.find("field 'provenance.host': expected an object"), std::string::npos) << not_object;
}

TEST(ProfileDb, InterpolatesBetweenMeasuredBatchSizes) {
  const auto p = emugpu::parse_profile(kProfile, "p.json");
  const auto exact = emugpu::interpolate(p, *p.table(1), 16);
  EXPECT_EQ(exact.kind, LookupKind::kExact);
  EXPECT_DOUBLE_EQ(exact.point.forward_s, 0.025);
  const auto mid = emugpu::interpolate(p, *p.table(1), 24);
  EXPECT_EQ(mid.kind, LookupKind::kInterpolated);
  EXPECT_NEAR(mid.point.forward_s, 0.0325, 1e-12);
  EXPECT_NEAR(mid.point.backward_s, 0.070, 1e-12);
  EXPECT_FALSE(mid.point.peak_bytes.has_value());  // not known at both neighbours
}

TEST(ProfileDb, ExtrapolatesLinearlyAndSaysSo) {
  const auto p = emugpu::parse_profile(kProfile, "p.json");
  const auto big = emugpu::interpolate(p, *p.table(1), 64);
  EXPECT_EQ(big.kind, LookupKind::kExtrapolated);
  EXPECT_NEAR(big.point.forward_s, 0.070, 1e-12);
  EXPECT_THROW(emugpu::interpolate(p, *p.table(1), 0), emugpu::Error);
}

TEST(ProfileDb, MalformedFilesNameTheFileAndField) {
  EXPECT_NE(error_of(replaced(kProfile, R"("model": "resnet50",)", "")).find("p.json: field 'model': missing"),
            std::string::npos);
  EXPECT_NE(
      error_of(replaced(kProfile, R"("forward_s": 0.025)", R"("forward_s": "fast")")).find("batches[1].forward_s"),
      std::string::npos);
  EXPECT_NE(error_of(replaced(kProfile, R"("batch_size": 16)", R"("batch_size": 64)")).find("increase strictly"),
            std::string::npos);
  EXPECT_NE(error_of(replaced(kProfile, R"("batch_size": 1,)", R"("batch_size": 0,)")).find("integer >= 1"),
            std::string::npos);
  const std::string empty = R"({"gpu": "t4", "model": "m", "provenance": {"tool": "t", "torch": "t",
      "dtype": "f", "date": "d", "source": "s"}, "batches": []})";
  EXPECT_NE(error_of(empty).find("at least one batch entry"), std::string::npos);
  EXPECT_NE(error_of("{not json").find("not valid JSON"), std::string::npos);
}

TEST(ProfileLimits, DeeplyNestedDocumentsAreRefusedNamingTheFile) {
  const std::string deep(100000, '[');
  std::string deep_objects;
  for (int i = 0; i < 100000; ++i) deep_objects += R"({"a":)";
  for (const std::string& text : {deep, deep_objects, replaced(kProfile, "0.025", deep + std::string(100000, ']')),
                                  replaced(kProfile, R"("unit test")", deep)}) {
    const std::string msg = error_of(text);
    EXPECT_NE(msg.find("profile p.json"), std::string::npos) << msg.substr(0, 300);
    EXPECT_NE(msg.find("deeper than 64 levels"), std::string::npos) << msg.substr(0, 300);
  }
}

TEST(ProfileLimits, WronglyTypedValuesAreEchoedBriefly) {
  const std::string nested = std::string(50, '[') + std::string(50, ']');
  const std::string msg = error_of(replaced(kProfile, "0.025", nested));
  EXPECT_NE(msg.find("batches[1].forward_s"), std::string::npos) << msg;
  EXPECT_LT(msg.size(), 300u) << msg;
  const std::string huge = error_of(
      replaced(kProfile, R"("unit test")", "\"" + std::string(100000, 'x') + "\"" + ", \"n\": 1, \"source2\": 2"));
  EXPECT_EQ(huge, "");  // long strings are fine where a string is expected
  const std::string long_number =
      error_of(replaced(kProfile, R"("model": "resnet50")", R"("model": 0.)" + std::string(100000, '7')));
  EXPECT_NE(long_number.find("field 'model'"), std::string::npos) << long_number.substr(0, 300);
  EXPECT_LT(long_number.size(), 300u);
  const std::string overflow = error_of(replaced(kProfile, "0.025", std::string(100000, '7')));
  EXPECT_NE(overflow.find("not valid JSON"), std::string::npos) << overflow.substr(0, 300);
  EXPECT_LT(overflow.size(), 400u);
}

TEST(ProfileLimits, OutOfRangeNumbersAreRefusedNamingTheField) {
  const std::vector<std::pair<std::pair<std::string, std::string>, std::string>> cases = {
      {{R"("forward_s": 0.010)", R"("forward_s": 1e9)"}, "batches[0].forward_s"},
      {{R"("forward_s": 0.010)", R"("forward_s": 3600.5)"}, "batches[0].forward_s"},
      {{R"("backward_s": 0.050)", R"("backward_s": -1)"}, "batches[1].backward_s"},
      {{R"("backward_s": 0.050)", R"("backward_s": 0)"}, "batches[1].backward_s"},
      {{R"("forward_s": 0.025)", R"("forward_s": 0.025, "transfer_pinned_s": 1e5)"}, "batches[1].transfer_pinned_s"},
      {{R"("forward_s": 0.025)", R"("forward_s": 0.025, "transfer_pageable_s": -0.1)"},
       "batches[1].transfer_pageable_s"},
      {{R"("peak_bytes": 100)", R"("peak_bytes": -5)"}, "batches[0].peak_bytes"},
      {{R"("peak_bytes": 100)", R"("peak_bytes": 2e18)"}, "batches[0].peak_bytes"},
      {{R"("persistent_bytes": 50)", R"("persistent_bytes": "50")"}, "batches[0].persistent_bytes"},
      {{R"("batch_size": 16)", R"("batch_size": 16.5)"}, "batches[1].batch_size"},
      {{R"("batch_size": 32, "forward_s": 0.040)", R"("batch_size": 4294967296, "forward_s": 0.040)"},
       "batches[2].batch_size"},
      {{R"("batch_size": 32, "forward_s": 0.040)", R"("batch_size": 1e300, "forward_s": 0.040)"},
       "batches[2].batch_size"},
      {{R"("gpu_count": 2)", R"("gpu_count": 1.5)"}, "data_parallel[0].gpu_count"},
      {{R"("gpu_count": 2)", R"("gpu_count": 4097)"}, "data_parallel[0].gpu_count"},
      {{R"("gpu_count": 2)", R"("gpu_count": 4294967298)"}, "data_parallel[0].gpu_count"},
      {{R"("gpu_count": 2)", R"("gpu_count": 18446744073709551615)"}, "data_parallel[0].gpu_count"},
      {{R"("parameters": 25557032)", R"("parameters": 1e300)"}, "fingerprint.parameters"},
      {{R"("parameters": 25557032)", R"("parameters": 2.5)"}, "fingerprint.parameters"},
  };
  for (const auto& [edit, field] : cases) {
    const std::string msg = error_of(replaced(kProfile, edit.first, edit.second));
    EXPECT_NE(msg.find("profile p.json: field '" + field + "'"), std::string::npos) << edit.second << ": " << msg;
  }
  EXPECT_NE(error_of(replaced(kProfile, R"("forward_s": 0.010)", R"("forward_s": 1e9)")).find("3600"),
            std::string::npos);
  EXPECT_NE(error_of(replaced(kProfile, R"("peak_bytes": 100)", R"("peak_bytes": 2e18)")).find("2^60"),
            std::string::npos);
  EXPECT_NE(error_of(replaced(kProfile, R"("gpu_count": 2)", R"("gpu_count": 4097)")).find("<= 4096"),
            std::string::npos);
}

TEST(ProfileLimits, NumbersTooLargeForADoubleAreRefusedAsInvalidJson) {
  const std::string msg = error_of(replaced(kProfile, "0.025", "1e400"));
  EXPECT_NE(msg.find("profile p.json: not valid JSON"), std::string::npos) << msg;
}

TEST(ProfileLimits, IntegralFloatBatchSizesAndNullOptionalsAreAccepted) {
  std::string text = replaced(kProfile, R"("batch_size": 16)", R"("batch_size": 16.0)");
  text = replaced(text, R"("peak_bytes": 100)", R"("peak_bytes": null)");
  const auto p = emugpu::parse_profile(text, "p.json");
  EXPECT_EQ(p.table(1)->points[1].batch_size, 16);
  EXPECT_FALSE(p.table(1)->points[0].peak_bytes.has_value());
}

TEST(ProfileDb, FindsProfilesByLooseGpuNameModelAndFingerprint) {
  const auto catalog = emugpu::Catalog::from_file(EMUGPU_CATALOG_PATH);
  emugpu::ProfileDb db;
  db.add(emugpu::parse_profile(kProfile, "p.json"));
  EXPECT_NE(db.find(catalog, "Tesla V100-PCIE-32GB", "resnet50"), nullptr);
  EXPECT_EQ(db.find(catalog, "v100", "resnet50"), nullptr);  // the SXM2 16GB part
  EXPECT_EQ(db.find(catalog, "Tesla V100-PCIE-32GB", "resnet18"), nullptr);
  EXPECT_NE(db.find_by_fingerprint(catalog, "V100-PCIE-32GB", 25557032), nullptr);
  EXPECT_EQ(db.find_by_fingerprint(catalog, "V100-PCIE-32GB", 11689512), nullptr);
}

TEST(ProfileDb, LooksUpByNameOrFingerprintAndGpuCount) {
  const auto catalog = emugpu::Catalog::from_file(EMUGPU_CATALOG_PATH);
  emugpu::ProfileDb db;
  db.add(emugpu::parse_profile(kProfile, "p.json"));
  const auto by_name = db.lookup(catalog, "V100-PCIE-32GB", "resnet50", std::nullopt, 16, 1);
  ASSERT_TRUE(by_name.has_value());
  EXPECT_DOUBLE_EQ(by_name->point.forward_s, 0.025);
  const auto by_params = db.lookup(catalog, "V100-PCIE-32GB", "", 25557032, 24, 1);
  ASSERT_TRUE(by_params.has_value());
  EXPECT_EQ(by_params->kind, emugpu::LookupKind::kInterpolated);
  EXPECT_DOUBLE_EQ(db.lookup(catalog, "V100-PCIE-32GB", "resnet50", std::nullopt, 32, 2)->point.forward_s, 0.041);
  EXPECT_FALSE(db.lookup(catalog, "V100-PCIE-32GB", "resnet50", std::nullopt, 32, 4).has_value());
  EXPECT_FALSE(db.lookup(catalog, "V100-PCIE-32GB", "", std::nullopt, 32, 1).has_value());
}

TEST(ProfileDb, ProfilesForGpusTheCatalogLacksAreRefusedButCpuStandInsPass) {
  const auto catalog = emugpu::Catalog::from_file(EMUGPU_CATALOG_PATH);
  emugpu::ProfileDb db;
  db.add(emugpu::parse_profile(replaced(kProfile, "Tesla_V100-PCIE-32GB", "CPU x86_64"), "cpu.json"));
  EXPECT_NO_THROW(db.check_gpus(catalog));
  db.add(emugpu::parse_profile(replaced(kProfile, "Tesla_V100-PCIE-32GB", "Imaginary X1"), "x1.json"));
  try {
    db.check_gpus(catalog);
    ADD_FAILURE() << "accepted a profile for an unknown GPU";
  } catch (const emugpu::Error& e) {
    EXPECT_NE(std::string(e.what()).find("x1.json: field 'gpu'"), std::string::npos) << e.what();
  }
}

TEST(ProfileDb, ScansDirectoriesAndEarlierOnesWin) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / "emugpu_profile_db_test";
  fs::remove_all(root);
  fs::create_directories(root / "a");
  fs::create_directories(root / "b");
  std::ofstream(root / "a" / "x.json") << kProfile;
  std::ofstream(root / "b" / "y.json") << replaced(kProfile, "\"forward_s\": 0.010", "\"forward_s\": 0.5");
  // other torch-emugpu data beside profiles is passed over, not rejected
  std::ofstream(root / "a" / "preprocessing.json") << R"({"schema": "torch-emugpu preprocessing v1", "ops": []})";
  emugpu::ProfileDb db;
  db.scan({(root / "a").string(), (root / "missing").string(), (root / "b").string()});
  ASSERT_EQ(db.profiles().size(), 1u);
  EXPECT_DOUBLE_EQ(db.profiles()[0].table(1)->points[0].forward_s, 0.010);
  fs::remove_all(root);
}

// A fresh directory of its own (ctest may run other worktrees' suites at once).
std::filesystem::path fresh_directory(const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / (name + "_" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  return root;
}

bool names(const std::vector<std::string>& warnings, const std::string& file) {
  for (const auto& w : warnings) {
    if (w.find(file) != std::string::npos) return true;
  }
  return false;
}

TEST(ProfileScan, SymlinkLoopsAreSkippedWithOneWarningAndTheOtherProfilesLoad) {
  namespace fs = std::filesystem;
  const fs::path root = fresh_directory("emugpu_profile_loop_test");
  std::ofstream(root / "good.json") << kProfile;
  fs::create_symlink("loop.json", root / "loop.json");  // refers to itself: ELOOP
  fs::create_symlink("b.json", root / "a.json");        // a -> b -> a
  fs::create_symlink("a.json", root / "b.json");
  fs::create_directories(root / "sub");
  fs::create_symlink("..", root / "sub" / "up");  // a directory loop: not followed, no warning
  emugpu::ProfileDb db;
  ASSERT_NO_THROW(db.scan({root.string()}));
  ASSERT_EQ(db.profiles().size(), 1u);
  EXPECT_EQ(db.warnings().size(), 3u);
  EXPECT_TRUE(names(db.warnings(), "loop.json"));
  EXPECT_TRUE(names(db.warnings(), "a.json"));
  EXPECT_TRUE(names(db.warnings(), "b.json"));
  EXPECT_FALSE(names(db.warnings(), "up"));
  fs::remove_all(root);
}

TEST(ProfileScan, UnreadableFilesAreSkippedWithOneWarning) {
  namespace fs = std::filesystem;
  const fs::path root = fresh_directory("emugpu_profile_unreadable_test");
  std::ofstream(root / "good.json") << kProfile;
  // A regular file whose read fails (EIO at address 0), even for root.
  fs::create_symlink("/proc/self/mem", root / "mem.json");
  emugpu::ProfileDb db;
  ASSERT_NO_THROW(db.scan({root.string()}));
  EXPECT_EQ(db.profiles().size(), 1u);
  ASSERT_EQ(db.warnings().size(), 1u);
  EXPECT_NE(db.warnings()[0].find("mem.json"), std::string::npos) << db.warnings()[0];
  fs::remove_all(root);
}

TEST(ProfileScan, DirectoriesWithoutPermissionAreSkippedWithOneWarning) {
  namespace fs = std::filesystem;
  if (geteuid() == 0) GTEST_SKIP() << "root reads any directory";
  const fs::path root = fresh_directory("emugpu_profile_permission_test");
  std::ofstream(root / "good.json") << kProfile;
  fs::create_directories(root / "closed");
  std::ofstream(root / "closed" / "other.json") << kProfile;
  fs::permissions(root / "closed", fs::perms::none);
  emugpu::ProfileDb db;
  EXPECT_NO_THROW(db.scan({root.string()}));
  fs::permissions(root / "closed", fs::perms::owner_all);
  EXPECT_EQ(db.profiles().size(), 1u);
  ASSERT_EQ(db.warnings().size(), 1u);
  EXPECT_NE(db.warnings()[0].find("closed"), std::string::npos) << db.warnings()[0];
  fs::remove_all(root);
}

TEST(ProfileLimits, BareNanAndInfinityAreRefusedNamingTheFileAndLine) {
  for (const char* token : {"NaN", "Infinity", "-Infinity"}) {
    const std::string msg = error_of(replaced(kProfile, "0.025", token));
    EXPECT_NE(msg.find("profile p.json"), std::string::npos) << token << ": " << msg;
    EXPECT_NE(msg.find("line 8 holds a bare NaN or Infinity"), std::string::npos) << token << ": " << msg;
  }
  // Inside a string they are just text.
  EXPECT_EQ(error_of(replaced(kProfile, "unit test", "NaN Infinity")), "");
}

TEST(ProfileScan, AMalformedProfileIsRefusedNamingTheFile) {
  namespace fs = std::filesystem;
  const fs::path root = fresh_directory("emugpu_profile_malformed_test");
  std::ofstream(root / "good.json") << kProfile;
  std::ofstream(root / "gpemu.json") << replaced(kProfile, "0.025", "NaN");
  emugpu::ProfileDb db;
  try {
    db.scan({root.string()});
    ADD_FAILURE() << "a profile holding NaN was accepted";
  } catch (const emugpu::Error& e) {
    EXPECT_NE(std::string(e.what()).find((root / "gpemu.json").string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("or remove the file"), std::string::npos) << e.what();
  }
  fs::remove_all(root);
}

TEST(ProfileLimits, InvalidUtf8IsRefusedNamingTheFileInValidUtf8) {
  const std::string msg = error_of(replaced(kProfile, "unit test", "unit \xff\xfe test"));
  EXPECT_NE(msg.find("profile p.json: not valid JSON"), std::string::npos) << msg;
  EXPECT_EQ(emugpu::valid_utf8(msg), msg) << msg;  // Python can decode it
  // A path with invalid bytes is escaped too.
  try {
    emugpu::parse_profile("[", "bad\xff.json");
    ADD_FAILURE() << "accepted '['";
  } catch (const emugpu::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad\\xff.json"), std::string::npos) << e.what();
  }
}

}  // namespace
