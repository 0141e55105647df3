#include "deferred_copies.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "error.h"

namespace {

using emugpu::Block;
using emugpu::DeferredCopies;

// Blocks of 100 bytes each, at distinct addresses; copies log their name.
struct Fixture {
  char memory[4][100] = {};
  Block blocks[4];
  std::vector<std::string> log;
  DeferredCopies copies;

  Fixture() {
    for (int i = 0; i < 4; ++i) {
      blocks[i].ptr = memory[i];
      blocks[i].size = sizeof(memory[i]);
    }
  }
  DeferredCopies::Copy named(const std::string& name) {
    return [this, name] { log.push_back(name); };
  }
};

TEST(DeferredCopies, ACopyWaitsUntilItsDestinationIsNeeded) {
  Fixture f;
  ASSERT_TRUE(f.copies.record(&f.blocks[1], &f.blocks[0], f.named("0->1"), true));
  EXPECT_TRUE(f.log.empty());
  EXPECT_TRUE(DeferredCopies::involved(&f.blocks[0]));
  EXPECT_TRUE(DeferredCopies::involved(&f.blocks[1]));
  f.copies.resolve(&f.blocks[1]);
  EXPECT_EQ(f.log, std::vector<std::string>{"0->1"});
  EXPECT_FALSE(DeferredCopies::involved(&f.blocks[0]));
  EXPECT_FALSE(DeferredCopies::involved(&f.blocks[1]));
  f.copies.resolve(&f.blocks[1]);  // done once
  EXPECT_EQ(f.log.size(), 1u);
  EXPECT_EQ(f.copies.stats().done, 1);
  EXPECT_EQ(f.copies.stats().pending, 0);
}

TEST(DeferredCopies, PiecesOfOneDestinationAreDoneInLaunchOrder) {
  Fixture f;
  f.copies.record(&f.blocks[2], &f.blocks[0], f.named("first"), false);
  f.copies.record(&f.blocks[2], &f.blocks[1], f.named("second"), false);
  f.copies.record(&f.blocks[2], &f.blocks[0], f.named("third"), false);
  f.copies.resolve(&f.blocks[2]);
  EXPECT_EQ(f.log, (std::vector<std::string>{"first", "second", "third"}));
  EXPECT_FALSE(DeferredCopies::involved(&f.blocks[0]));
}

TEST(DeferredCopies, AWholeOverwriteDropsEarlierCopiesIntoTheBlock) {
  Fixture f;
  f.copies.record(&f.blocks[2], &f.blocks[0], f.named("stale"), true);
  f.copies.record(&f.blocks[2], &f.blocks[1], f.named("fresh"), true);
  EXPECT_FALSE(DeferredCopies::involved(&f.blocks[0]));
  f.copies.resolve(&f.blocks[2]);
  EXPECT_EQ(f.log, std::vector<std::string>{"fresh"});
  EXPECT_EQ(f.copies.stats().dropped, 1);
}

TEST(DeferredCopies, WritingASourceFirstDoesTheCopiesThatReadIt) {
  Fixture f;
  f.copies.record(&f.blocks[1], &f.blocks[0], f.named("0->1"), true);
  f.copies.record(&f.blocks[2], &f.blocks[0], f.named("0->2"), true);
  f.copies.before_write(&f.blocks[0]);
  EXPECT_EQ(f.log.size(), 2u);
  EXPECT_FALSE(DeferredCopies::involved(&f.blocks[0]));
  EXPECT_FALSE(DeferredCopies::involved(&f.blocks[1]));
}

TEST(DeferredCopies, AChainResolvesItsSourcesFirst) {
  Fixture f;
  f.copies.record(&f.blocks[1], &f.blocks[0], f.named("0->1"), true);
  f.copies.record(&f.blocks[2], &f.blocks[1], f.named("1->2"), true);
  f.copies.resolve(&f.blocks[2]);
  EXPECT_EQ(f.log, (std::vector<std::string>{"0->1", "1->2"}));
  EXPECT_EQ(f.copies.stats().pending, 0);
}

TEST(DeferredCopies, DiscardingABlockDoesItsReadersAndDropsItsOwnCopies) {
  Fixture f;
  f.copies.record(&f.blocks[1], &f.blocks[0], f.named("0->1"), true);
  f.copies.record(&f.blocks[2], &f.blocks[1], f.named("1->2"), true);
  // Block 1 is freed (or a placeholder overwrites it): block 2 needs its bytes first, so 0->1 is done too.
  f.copies.discard(&f.blocks[1]);
  EXPECT_EQ(f.log, (std::vector<std::string>{"0->1", "1->2"}));
  f.log.clear();
  f.copies.record(&f.blocks[3], &f.blocks[0], f.named("0->3"), true);
  f.copies.discard(&f.blocks[3]);  // nobody reads it: its copy is never done
  EXPECT_TRUE(f.log.empty());
  EXPECT_FALSE(DeferredCopies::involved(&f.blocks[0]));
  EXPECT_EQ(f.copies.stats().dropped, 1);
}

TEST(DeferredCopies, WritingADestinationCannotMakeACycle) {
  Fixture f;
  f.copies.record(&f.blocks[1], &f.blocks[0], f.named("0->1"), true);
  // Copying back into the source writes it: 0->1 is done first, with the source's old bytes.
  f.copies.record(&f.blocks[0], &f.blocks[1], f.named("1->0"), true);
  EXPECT_EQ(f.log, std::vector<std::string>{"0->1"});
  f.copies.resolve(&f.blocks[0]);
  EXPECT_EQ(f.log, (std::vector<std::string>{"0->1", "1->0"}));
}

TEST(DeferredCopies, ABoundedNumberOfPiecesWaitPerBlock) {
  Fixture f;
  EXPECT_TRUE(f.copies.record(&f.blocks[1], &f.blocks[0], f.named("a"), false, 2));
  EXPECT_TRUE(f.copies.record(&f.blocks[1], &f.blocks[0], f.named("b"), false, 2));
  EXPECT_FALSE(f.copies.record(&f.blocks[1], &f.blocks[0], f.named("c"), false, 2));
  EXPECT_EQ(f.copies.stats().pending, 2);
}

TEST(DeferredCopies, FindsTheInvolvedBlockHoldingAnAddress) {
  Fixture f;
  f.copies.record(&f.blocks[1], &f.blocks[0], f.named("0->1"), true);
  EXPECT_EQ(f.copies.find(f.memory[1] + 99), &f.blocks[1]);
  EXPECT_EQ(f.copies.find(f.memory[0]), &f.blocks[0]);
  EXPECT_EQ(f.copies.find(f.memory[2]), nullptr);
}

TEST(DeferredCopies, AFailedCopyLeavesNoDanglingReader) {
  Fixture f;
  f.copies.record(
      &f.blocks[1], &f.blocks[0], [] { throw std::runtime_error("copy failed"); }, false);
  f.copies.record(&f.blocks[1], &f.blocks[2], f.named("2->1"), false);
  EXPECT_THROW(f.copies.resolve(&f.blocks[1]), std::runtime_error);
  EXPECT_FALSE(DeferredCopies::involved(&f.blocks[0]));
  EXPECT_FALSE(DeferredCopies::involved(&f.blocks[1]));
  EXPECT_FALSE(DeferredCopies::involved(&f.blocks[2]));
  EXPECT_EQ(f.copies.stats().pending, 0);
}

TEST(DeferredCopies, RefusesACopyWithinOneBlock) {
  Fixture f;
  EXPECT_THROW(f.copies.record(&f.blocks[0], &f.blocks[0], f.named("0->0"), true), emugpu::Error);
}

}  // namespace
