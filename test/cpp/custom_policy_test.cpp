// Sharing policies from outside emugpud's core (custom_policy.h): a plugin
// library and a program on a pipe, and what happens when either is broken.
#include "daemon/custom_policy.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "error.h"

namespace {

using namespace emugpu::share;

SharingConfig custom(const std::string& spec) {
  SharingConfig c;
  c.policy = SharingPolicy::kCustom;
  c.custom = load_custom_policy(spec);
  c.custom_name = spec;
  return c;
}

std::string error_of(const std::string& spec) {
  try {
    load_custom_policy(spec);
  } catch (const emugpu::Error& e) {
    EXPECT_EQ(e.kind(), emugpu::ErrorKind::kValue);
    return e.what();
  }
  return "";
}

TEST(CustomPolicy, APluginLibraryDecidesTheShare) {
  const SharingConfig c = custom(std::string("plugin:") + EMUGPU_TEST_POLICY_PLUGIN);
  EXPECT_EQ(c.name(), std::string("plugin:") + EMUGPU_TEST_POLICY_PLUGIN);
  EXPECT_DOUBLE_EQ(compute_share(c, {1.0, 0, 0}, {}), 1.0);
  EXPECT_DOUBLE_EQ(compute_share(c, {1.0, 0, 0}, {{1.0, 0, 0}, {1.0, 0, 0}}), 1.0 / 3);
  EXPECT_DOUBLE_EQ(compute_share(c, {1.0, 0, 0}, {{1.0, 0, 3}}), kMinShare);  // its 0, clamped
  EXPECT_DOUBLE_EQ(compute_share(c, {1.0, 0, 3}, {{1.0, 0, 0}}), 1.0);
}

TEST(CustomPolicy, AProgramAnswersALinePerRequest) {
  // The request: the number of others, then busy, iteration, priority, demand and hold of each.
  const SharingConfig c = custom(
      "exec:while read n busy iteration priority demand hold other; do "
      "if [ \"$n $busy $iteration $priority $demand $hold $other\" = \"1 0.5 7 2 0.25 9 1 0 0 1 0\" ]; "
      "then echo 0.75; else echo 0.125; fi; done");
  EXPECT_DOUBLE_EQ(compute_share(c, {0.5, 7, 2, 0.25, 9}, {{1.0, 0, 0}}), 0.75);
  EXPECT_DOUBLE_EQ(compute_share(c, {0.5, 7, 2, 0.25, 9}, {}), 0.125);
  EXPECT_DOUBLE_EQ(compute_share(c, {0.5, 7, 2, 0.25, 9}, {{1.0, 0, 0}}), 0.75);  // and again
}

TEST(CustomPolicy, ABrokenProgramIsGivenUpForTimeSlicing) {
  const Sharer me{1.0, 0, 0};
  const std::vector<Sharer> others{{1.0, 0, 0}};
  const double time_slice = compute_share(SharingConfig{}, me, others);
  for (const char* spec : {"exec:exit 0", "exec:while read l; do echo nope; done", "exec:sleep 5"}) {
    const SharingConfig c = custom(spec);
    EXPECT_DOUBLE_EQ(compute_share(c, me, others), time_slice) << spec;
    EXPECT_DOUBLE_EQ(compute_share(c, me, others), time_slice) << spec;  // given up: no second wait
  }
}

TEST(CustomPolicy, BadSpecsAreRefusedSayingWhatWasExpected) {
  EXPECT_NE(error_of("plugin:/nonexistent/policy.so").find("expected a shared library"), std::string::npos);
  EXPECT_NE(error_of("plugin:libc.so.6").find("expected an exported C function emugpu_share_policy"),
            std::string::npos);
  EXPECT_NE(error_of("exec:").find("expected a command"), std::string::npos);
  EXPECT_NE(error_of("lua:x").find("expected plugin:PATH or exec:COMMAND"), std::string::npos);
  EXPECT_TRUE(is_custom_policy("exec:x"));
  EXPECT_FALSE(is_custom_policy("time-slice"));
}

}  // namespace
