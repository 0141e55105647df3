#include "exchange/words.h"

#include <gtest/gtest.h>

#include <array>
#include <vector>

#include "error.h"

namespace {

using emugpu::CollectiveSignature;
using emugpu::CollectiveWords;
using emugpu::GatheredWords;

std::vector<int64_t> rows(const std::vector<CollectiveWords>& ranks) {
  std::vector<int64_t> out(ranks.size() * CollectiveWords::kCount);
  for (size_t r = 0; r < ranks.size(); ++r) ranks[r].encode(out.data() + r * CollectiveWords::kCount);
  return out;
}

CollectiveWords small_real(int64_t start) {
  CollectiveWords w;
  w.start = start;
  w.real = true;
  w.signature = 7;
  w.model_bytes = 100;
  w.largest = 64;
  w.payload = 64;
  return w;
}

TEST(CollectiveWords, EncodeRoundTripsThroughGatheredWords) {
  CollectiveWords w = small_real(123);
  w.compute = true;
  w.signature = 0xfedcba9876543210ull;
  const GatheredWords g(rows({w}), 1);
  EXPECT_EQ(g.at(0, CollectiveWords::kStart), 123);
  EXPECT_EQ(g.at(0, CollectiveWords::kReal), 1);
  EXPECT_EQ(g.at(0, CollectiveWords::kCompute), 1);
  EXPECT_EQ(static_cast<uint64_t>(g.at(0, CollectiveWords::kSignature)), 0xfedcba9876543210ull);
  EXPECT_EQ(g.first_disagreeing(0xfedcba9876543210ull), -1);
}

TEST(CollectiveWords, StartIsTheLatestRanksStart) {
  const GatheredWords g(rows({small_real(50), small_real(900), small_real(10)}), 3);
  EXPECT_EQ(g.start(), 900);
}

TEST(CollectiveWords, SmallRealTensorsOnEveryRankMoveBytes) {
  const GatheredWords g(rows({small_real(0), small_real(0)}), 2);
  EXPECT_TRUE(g.moves_bytes(64));
  EXPECT_FALSE(g.moves_bytes(63));  // one tensor over the threshold: no rank moves bytes
}

TEST(CollectiveWords, OneRankWithoutRealBytesStopsTheMove) {
  CollectiveWords placeholder = small_real(0);
  placeholder.real = false;
  EXPECT_FALSE(GatheredWords(rows({small_real(0), placeholder}), 2).moves_bytes(1 << 20));
}

TEST(CollectiveWords, ComputeModeOnEveryRankMovesAnySize) {
  CollectiveWords big = small_real(0);
  big.compute = true;
  big.real = false;
  big.largest = int64_t{1} << 40;
  EXPECT_TRUE(GatheredWords(rows({big, big}), 2).moves_bytes(64));
  EXPECT_FALSE(GatheredWords(rows({big, small_real(0)}), 2).moves_bytes(64));
}

TEST(CollectiveWords, FirstDisagreeingNamesTheRank) {
  CollectiveWords other = small_real(0);
  other.signature = 8;
  const GatheredWords g(rows({small_real(0), small_real(0), other, other}), 4);
  EXPECT_EQ(g.first_disagreeing(7), 2);
  EXPECT_EQ(g.first_disagreeing(8), 0);
}

TEST(CollectiveWords, RejectsRowsOfTheWrongLength) {
  EXPECT_THROW(GatheredWords(std::vector<int64_t>(5), 1), emugpu::Error);
  const GatheredWords g(rows({small_real(0)}), 1);
  EXPECT_THROW((void)g.at(1, CollectiveWords::kStart), emugpu::Error);
}

uint64_t signature(const char* name, const char* extra, const std::vector<std::vector<int64_t>>& shapes,
                   int64_t dtype = 6) {
  CollectiveSignature s(name, extra, shapes.size());
  for (const auto& shape : shapes) s.add_tensor(shape.data(), static_cast<int64_t>(shape.size()), dtype);
  return s.value();
}

TEST(CollectiveSignature, EqualCallsAgreeAndEachPartCounts) {
  const uint64_t base = signature("all_reduce", "SUM", {{2, 3}});
  EXPECT_EQ(base, signature("all_reduce", "SUM", {{2, 3}}));
  EXPECT_NE(base, signature("broadcast", "SUM", {{2, 3}}));
  EXPECT_NE(base, signature("all_reduce", "MAX", {{2, 3}}));
  EXPECT_NE(base, signature("all_reduce", "SUM", {{3, 2}}));
  EXPECT_NE(base, signature("all_reduce", "SUM", {{6}}));
  EXPECT_NE(base, signature("all_reduce", "SUM", {{2, 3}}, 5));
  EXPECT_NE(base, signature("all_reduce", "SUM", {{2, 3}, {2, 3}}));
  // The text's length enters too: "ab"+"c" differs from "a"+"bc".
  EXPECT_NE(signature("ab", "c", {}), signature("a", "bc", {}));
}

TEST(CollectiveWords, DisagreementMessageSaysBothCallsAndWhatToDo) {
  const std::string m = emugpu::disagreement_message(0, "all_reduce on [(4,) float32], SUM", 1, "broadcast");
  EXPECT_NE(m.find("rank 0 called all_reduce on [(4,) float32], SUM"), std::string::npos);
  EXPECT_NE(m.find("rank 1 called broadcast"), std::string::npos);
  EXPECT_NE(m.find("every rank must call the same collective"), std::string::npos);
}

TEST(CollectiveWords, AReportFromTheStoreIsOnlyQuotedPrintableAndShort) {
  // What a hostile store client could plant: a pickle that runs a command, and megabytes of it.
  const std::string planted = std::string(
                                  "\x80\x04\x95"
                                  "cos\nsystem\n(S'touch /tmp/x'\ntR.",
                                  30) +
                              std::string(1 << 20, 'A');
  const std::string m = emugpu::disagreement_message(0, "barrier", 1, planted);
  EXPECT_NE(m.find("rank 1 called \\x80\\x04\\x95cos\\x0asystem\\x0a"), std::string::npos) << m.substr(0, 200);
  EXPECT_NE(m.find("(1048606 bytes)"), std::string::npos);
  EXPECT_LT(m.size(), 1000u);
  for (char ch : m) EXPECT_TRUE(ch >= 0x20 && ch < 0x7f) << "a control byte reached the message";
}

}  // namespace
