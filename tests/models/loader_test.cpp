// The data-order contract: any world size sees the same global batch, so a
// run at W=2 reproduces W=1.

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <set>

#include <gtest/gtest.h>

#include "fsdp/common/error.h"
#include "fsdp/data/loader.h"
#include "fsdp/data/loss_mask.h"
#include "fsdp/data/mixture.h"
#include "fsdp/data/tokenizer_record.h"

namespace fsdp::data::loader_test {
namespace {

std::string token_file(const std::string& name, int64_t n, int32_t vocab) {
  const auto path = "/tmp/fsdp-loader-" + std::to_string(::getpid()) + "-" + name + ".bin";
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7 + 3) % vocab);
  write_token_file(path, tokens);
  return path;
}

// A loader as the trainer builds one: (source, B, T, rank, W, A, vocab, seed).
DataLoader make(const std::string& source, int64_t B, int64_t T, int rank, int world, int A, int64_t vocab,
                uint64_t seed, bool shuffle = false, bool pack = false) {
  LoaderOptions o;
  o.pack = pack;
  o.batch_size = B;
  o.seq_len = T;
  o.rank = rank;
  o.world = world;
  o.grad_accum = A;
  o.vocab_size = vocab;
  o.seed = seed;
  o.shuffle = shuffle;
  return DataLoader(source, o);
}

TEST(DataOrder, TwoRanksTogetherReadWhatOneRankReads) {
  const auto path = token_file("order", 1000, 100);
  const int64_t B = 2, T = 8;
  // W=1 with batch 2B and one micro-step versus W=2 with batch B: the same rows.
  for (int A : {1, 2}) {
    auto one = make(path, B * 2, T, 0, 1, A, 100, 0);
    auto r0 = make(path, B, T, 0, 2, A, 100, 0), r1 = make(path, B, T, 1, 2, A, 100, 0);
    for (int64_t step = 0; step < 40; ++step) {  // 40 steps wrap around the file
      for (int a = 0; a < A; ++a) {
        const auto whole = one.batch(step, a);
        const auto b0 = r0.batch(step, a), b1 = r1.batch(step, a);
        EXPECT_TRUE(torch::cat({b0.inputs, b1.inputs}).equal(whole.inputs)) << "step " << step << " micro " << a;
        EXPECT_TRUE(torch::cat({b0.targets, b1.targets}).equal(whole.targets)) << "step " << step << " micro " << a;
      }
    }
  }
}

TEST(DataOrder, OffsetsFollowTheFormulaAndTargetsAreShiftedInputs) {
  const auto path = token_file("formula", 5000, 100);
  const int64_t B = 3, T = 5;
  auto loader = make(path, B, T, 1, 4, 2, 100, 0);
  EXPECT_EQ(loader.offset(3, 1), ((3 * 2 + 1) * 4 + 1) * B * T);
  const auto batch = loader.batch(3, 1);
  const int64_t start = loader.offset(3, 1);
  for (int64_t i = 0; i < B * T; ++i) {
    EXPECT_EQ(batch.inputs.view({-1})[i].item<int64_t>(), ((start + i) * 7 + 3) % 100);
    EXPECT_EQ(batch.targets.view({-1})[i].item<int64_t>(), ((start + i + 1) * 7 + 3) % 100);
  }
}

// A checkpoint's tokens_seen and the run's steps place each batch; a count
// whose position a 64-bit integer cannot hold is refused, shuffled or not,
// where it crashed (a negative position) or looped before. The largest
// count a checkpoint may hold still reads: positions wrap around the file.
TEST(DataOrder, PositionsPastInt64AreRefusedAndTheLargestCheckpointCountsRead) {
  const auto path = token_file("overflow", 1000, 100);
  for (const bool shuffle : {false, true}) {
    auto loader = make(path, 2, 8, 1, 2, 2, 100, 0, shuffle);
    loader.resume_at(3, int64_t{1} << 62);
    const auto batch = loader.batch(7, 1);
    EXPECT_EQ(batch.inputs.size(0), 2);
    for (const int64_t tokens : {INT64_MAX, INT64_MAX - 100}) {
      auto past = make(path, 2, 8, 1, 2, 2, 100, 0, shuffle);
      try {
        past.resume_at(3, tokens);  // INT64_MAX: its next whole sequence is past int64 already
        past.batch(10, 0);  // INT64_MAX - 100: 7 steps on, 464 tokens later, past int64
        FAIL() << tokens << " tokens seen were accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("is past what a 64-bit count holds"), std::string::npos) << e.what();
      }
    }
    EXPECT_THROW(loader.resume_at(0, -8), Error);
  }
}

TEST(DataOrder, TokenIdsBeyondTheVocabularyAreRejected) {
  const auto path = token_file("vocab", 1000, 300);
  try {
    auto loader = make(path, 2, 8, 0, 1, 1, 256, 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 299"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("vocabulary of 256"), std::string::npos) << e.what();
  }
}

TEST(DataOrder, SyntheticDataKeepsTheContractToo) {
  auto one = make("synthetic", 4, 8, 0, 1, 1, 100, 9);
  auto r0 = make("synthetic", 2, 8, 0, 2, 1, 100, 9), r1 = make("synthetic", 2, 8, 1, 2, 1, 100, 9);
  for (int64_t step = 0; step < 5; ++step) {
    EXPECT_TRUE(torch::cat({r0.batch(step, 0).inputs, r1.batch(step, 0).inputs}).equal(one.batch(step, 0).inputs));
  }
}

TEST(DataOrder, SyntheticDataDiffersByRankAndRepeatsBySeed) {
  auto a = make("synthetic", 2, 8, 0, 2, 1, 100, 5), b = make("synthetic", 2, 8, 1, 2, 1, 100, 5);
  auto a_again = make("synthetic", 2, 8, 0, 2, 1, 100, 5);
  EXPECT_FALSE(a.batch(0, 0).inputs.equal(b.batch(0, 0).inputs));
  EXPECT_TRUE(a.batch(4, 0).inputs.equal(a_again.batch(4, 0).inputs));
  EXPECT_LT(a.batch(0, 0).inputs.max().item<int64_t>(), 100);
}

// Three shard files read as one stream equal the single file they were cut from.
std::string shards_of(const std::string& name, int64_t n, int32_t vocab, std::vector<int64_t> cuts) {
  const auto dir = "/tmp/fsdp-loader-" + std::to_string(::getpid()) + "-" + name;
  std::filesystem::create_directories(dir);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7 + 3) % vocab);
  cuts.insert(cuts.begin(), 0);
  cuts.push_back(n);
  for (size_t k = 0; k + 1 < cuts.size(); ++k) {
    write_token_file(dir + "/train_00" + std::to_string(k) + ".bin",
                     {tokens.begin() + cuts[k], tokens.begin() + cuts[k + 1]});
  }
  return dir;
}

TEST(DataOrder, ShardsReadAsOneStreamInNameOrder) {
  const auto whole = token_file("whole", 1000, 100);
  const auto dir = shards_of("shards", 1000, 100, {333, 700});
  auto one = make(whole, 4, 8, 0, 1, 1, 100, 0);
  auto sharded = make(dir + "/train_*.bin", 4, 8, 0, 1, 1, 100, 0);
  auto listed = make(dir + "/train_000.bin," + dir + "/train_001.bin," + dir + "/train_002.bin", 4, 8, 0, 1, 1, 100, 0);
  EXPECT_EQ(sharded.files(), 3u);
  for (int64_t step = 0; step < 70; ++step) {  // crosses both boundaries and wraps around
    EXPECT_TRUE(sharded.batch(step, 0).inputs.equal(one.batch(step, 0).inputs)) << step;
    EXPECT_TRUE(sharded.batch(step, 0).targets.equal(one.batch(step, 0).targets)) << step;
    EXPECT_TRUE(listed.batch(step, 0).inputs.equal(one.batch(step, 0).inputs)) << step;
  }
}

TEST(DataOrder, ShuffleVisitsEveryWindowOncePerEpochAndKeepsTheContract) {
  const auto dir = shards_of("shuffle", 1001, 100, {400});
  const int64_t T = 10, windows = 100;  // (1001 - 1) / 10
  auto one = make(dir + "/train_*.bin", 4, T, 0, 1, 1, 100, 7, true);
  auto r0 = make(dir + "/train_*.bin", 2, T, 0, 2, 1, 100, 7, true);
  auto r1 = make(dir + "/train_*.bin", 2, T, 1, 2, 1, 100, 7, true);
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::set<int64_t> starts;
    for (int64_t i = 0; i < windows; ++i) starts.insert(one.sequence_start(epoch * windows + i));
    EXPECT_EQ(starts.size(), static_cast<size_t>(windows)) << "a permutation of the windows";
    EXPECT_EQ(*starts.rbegin(), (windows - 1) * T);
  }
  std::vector<int64_t> first_epoch, second_epoch;
  for (int64_t i = 0; i < windows; ++i) {
    first_epoch.push_back(one.sequence_start(i));
    second_epoch.push_back(one.sequence_start(windows + i));
  }
  EXPECT_NE(first_epoch, second_epoch) << "each epoch has its own order";
  auto unshuffled = make(dir + "/train_*.bin", 4, T, 0, 1, 1, 100, 7);
  EXPECT_FALSE(one.batch(0, 0).inputs.equal(unshuffled.batch(0, 0).inputs));
  for (int64_t step = 0; step < 60; ++step) {
    const auto whole = one.batch(step, 0);
    EXPECT_TRUE(torch::cat({r0.batch(step, 0).inputs, r1.batch(step, 0).inputs}).equal(whole.inputs)) << step;
    // Targets are the next tokens of the same window.
    const int64_t start = one.sequence_start(step * 4);
    EXPECT_EQ(whole.targets[0][T - 1].item<int64_t>(), ((start + T) * 7 + 3) % 100);
  }
}

TEST(DataOrder, ResumeContinuesFromTheTokensConsumedWhateverTheBatch) {
  const auto path = token_file("resume", 5000, 100);
  // 3 steps at batch 4 consumed 3 * 4 * 8 tokens; a resume at batch 1 on two
  // ranks reads the next sequences, with none read twice or skipped.
  auto before = make(path, 4, 8, 0, 1, 1, 100, 0);
  auto r0 = make(path, 1, 8, 0, 2, 1, 100, 0), r1 = make(path, 1, 8, 1, 2, 1, 100, 0);
  r0.resume_at(3, 3 * 4 * 8);
  r1.resume_at(3, 3 * 4 * 8);
  auto continued = make(path, 2, 8, 0, 1, 1, 100, 0);
  for (int64_t s = 3; s < 9; ++s) {
    const auto expected = continued.batch(s - 3 + 6, 0);  // sequences 12, 13, ... in batches of 2
    EXPECT_TRUE(torch::cat({r0.batch(s, 0).inputs, r1.batch(s, 0).inputs}).equal(expected.inputs)) << s;
  }
  EXPECT_EQ(r0.offset(3, 0), before.offset(3, 0));
}

// Two sources told apart by their tokens: A's are below 50, B's 50 and up.
std::string source_file(const std::string& name, int32_t base, int64_t n) {
  const auto path = "/tmp/fsdp-loader-" + std::to_string(::getpid()) + "-" + name + ".bin";
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = base + static_cast<int32_t>((i * 7 + 3) % 50);
  write_token_file(path, tokens);
  return path;
}

TEST(Mixture, EachSourceIsReadInItsOwnOrderAtItsWeightAndInterleaved) {
  const auto a = source_file("mix-a", 0, 4001), b = source_file("mix-b", 50, 2001);
  const int64_t T = 8, B = 4;
  auto mixed = make(a + ":0.7," + b + ":0.3", B, T, 0, 1, 1, 100, 0);
  // Each source alone, one sequence a step: what its k-th row must be.
  auto only_a = make(a, 1, T, 0, 1, 1, 100, 0), only_b = make(b, 1, T, 0, 1, 1, 100, 0);
  int64_t from_a = 0, from_b = 0;
  std::vector<int> window;
  for (int64_t step = 0; step < 500; ++step) {  // 2000 sequences: two periods
    const auto batch = mixed.batch(step, 0);
    for (int64_t r = 0; r < B; ++r) {
      const auto row = batch.inputs[r];
      const bool is_a = row.lt(50).all().item<bool>();
      ASSERT_TRUE(is_a || row.ge(50).all().item<bool>()) << "a row of both sources at step " << step;
      const auto expected = (is_a ? only_a.batch(from_a, 0) : only_b.batch(from_b, 0)).inputs[0];
      EXPECT_TRUE(row.equal(expected)) << (is_a ? "A" : "B") << "'s row " << (is_a ? from_a : from_b)
                                       << " out of its order at step " << step;
      (is_a ? from_a : from_b) += 1;
      window.push_back(is_a);
    }
  }
  EXPECT_EQ(from_a, 1400);
  EXPECT_EQ(from_b, 600);
  // Evenly: every 10 consecutive sequences hold 7 of A's, give or take one.
  for (size_t i = 0; i + 10 <= window.size(); ++i) {
    const int in_window = std::accumulate(window.begin() + static_cast<std::ptrdiff_t>(i),
                                          window.begin() + static_cast<std::ptrdiff_t>(i) + 10, 0);
    ASSERT_GE(in_window, 6) << "at sequence " << i;
    ASSERT_LE(in_window, 8) << "at sequence " << i;
  }
}

TEST(Mixture, TwoRanksReadWhatOneReadsAndAResumeContinuesWhereItStopped) {
  const auto a = source_file("mix2-a", 0, 3001), b = source_file("mix2-b", 50, 1501);
  const std::string spec = a + ":2," + b + ":1";
  const int64_t T = 8;
  for (bool shuffle : {false, true}) {
    auto one = make(spec, 4, T, 0, 1, 1, 100, 5, shuffle);
    auto r0 = make(spec, 2, T, 0, 2, 1, 100, 5, shuffle), r1 = make(spec, 2, T, 1, 2, 1, 100, 5, shuffle);
    for (int64_t step = 0; step < 300; ++step) {
      EXPECT_TRUE(torch::cat({r0.batch(step, 0).inputs, r1.batch(step, 0).inputs}).equal(one.batch(step, 0).inputs))
          << "step " << step << (shuffle ? " (shuffled)" : "");
    }
    // Stopped after 7 steps of 4 sequences, resumed at batch 1: the next sequences.
    auto resumed = make(spec, 1, T, 0, 1, 1, 100, 5, shuffle);
    resumed.resume_at(7, 7 * 4 * T);
    for (int64_t s = 0; s < 12; ++s) {
      EXPECT_TRUE(resumed.batch(7 + s, 0).inputs[0].equal(one.batch(7 + s / 4, 0).inputs[s % 4])) << s;
    }
  }
}

TEST(Mixture, BadWeightsAndMixedKindsAreRefusedByName) {
  const auto a = source_file("mix3-a", 0, 401), b = source_file("mix3-b", 50, 401);
  const auto refused = [&](const std::string& spec, bool pack, const std::string& expected) {
    try {
      make(spec, 1, 8, 0, 1, 1, 100, 0, false, pack);
      ADD_FAILURE() << spec << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  refused(a + ":0.7," + b, false, "weights some sources and not others");
  refused(a + ":-1," + b + ":1", false, "expected a positive number");
  refused(a + ":0.0001," + b + ":1", false, "less than one sequence in 1000");
  refused(a + ":1," + b + ":1", true, "train them one a row, without --pack");
  EXPECT_TRUE(parse_mixture(a + "," + b, "--data").empty()) << "a list without weights is one stream";
  // Slots a period: 700 and 300, each index of each source once.
  MixtureSchedule schedule({0.7, 0.3});
  EXPECT_EQ(schedule.slots(), (std::vector<int64_t>{700, 300}));
  std::set<std::pair<int, int64_t>> seen;
  for (int64_t i = 0; i < MixtureSchedule::kPeriod; ++i) seen.insert(schedule.locate(i));
  EXPECT_EQ(seen.size(), 1000u);
  EXPECT_EQ(*seen.rbegin(), (std::pair<int, int64_t>{1, 299}));
}

TEST(DataOrder, PermutationIsABijectionForAnySize) {
  for (int64_t n : {1, 2, 3, 5, 17, 64, 1000}) {
    std::set<int64_t> seen;
    for (int64_t i = 0; i < n; ++i) seen.insert(permute_index(i, n, 42, 3));
    EXPECT_EQ(seen.size(), static_cast<size_t>(n));
    EXPECT_LT(*seen.rbegin(), n);
  }
}

TEST(DataOrder, DirectoriesAndEmptyGlobsAreNamed) {
  const auto dir = shards_of("errors", 100, 50, {});
  try {
    make(dir, 1, 8, 0, 1, 1, 100, 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
  }
  try {
    make(dir + "/val_*.bin", 1, 8, 0, 1, 1, 100, 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("matches no file"), std::string::npos) << e.what();
  }
}

// Chat data as `data prepare` writes it: EXAMPLES (token lists) with the
// trained flags TRAINED, in a folder with the record that says so.
std::string example_files(const std::string& name, const std::vector<std::vector<int32_t>>& examples,
                          const std::vector<std::vector<uint8_t>>& trained) {
  const auto dir = "/tmp/fsdp-loader-" + std::to_string(::getpid()) + "-" + name;
  std::filesystem::create_directories(dir);
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  for (size_t e = 0; e < examples.size(); ++e) {
    for (size_t k = 0; k < examples[e].size(); ++k) {
      tokens.push_back(examples[e][k]);
      mask.push_back(static_cast<uint8_t>((trained[e][k] ? kMaskTrained : 0) | (k == 0 ? kMaskExampleStart : 0)));
    }
  }
  write_token_file(dir + "/train.bin", tokens);
  write_loss_mask_file(dir + "/train.mask", mask);
  TokenizerRecord record{"test", 100, "0", 0};
  record.files = {"train.bin"};
  record.examples = true;
  write_tokenizer_record(dir, record);
  return dir + "/train.bin";
}

TEST(ChatExamples, EachRowIsOneExampleFromItsStartPaddedOrCutWithUntrainedTargetsIgnored) {
  // Three examples: 4 tokens (the last two trained), 9 (all trained), 2.
  const auto path = example_files("rows", {{10, 11, 12, 13}, {20, 21, 22, 23, 24, 25, 26, 27, 28}, {30, 31}},
                                  {{0, 0, 1, 1}, {1, 1, 1, 1, 1, 1, 1, 1, 1}, {0, 1}});
  const int64_t T = 5;
  auto loader = make(path, 1, T, 0, 1, 1, 100, 0);
  EXPECT_EQ(loader.examples(), 3);
  EXPECT_EQ(loader.longest_example(), 9);
  EXPECT_EQ(loader.examples_longer_than_a_row(), 1);  // 9 > T + 1
  const std::vector<std::vector<int64_t>> inputs = {{10, 11, 12, 13, 0}, {20, 21, 22, 23, 24}, {30, 31, 0, 0, 0},
                                                    {10, 11, 12, 13, 0}};
  // Target k is token k + 1, counted when that token is trained.
  const std::vector<std::vector<int64_t>> targets = {
      {-100, 12, 13, -100, -100}, {21, 22, 23, 24, 25}, {31, -100, -100, -100, -100}, {-100, 12, 13, -100, -100}};
  const std::vector<int64_t> counted = {2, 5, 1, 2};
  for (int64_t step = 0; step < 4; ++step) {  // the fourth wraps to the first example
    const auto b = loader.batch(step, 0);
    EXPECT_TRUE(b.inputs.equal(torch::tensor(inputs[static_cast<size_t>(step)]).unsqueeze(0))) << "step " << step;
    EXPECT_TRUE(b.targets.equal(torch::tensor(targets[static_cast<size_t>(step)]).unsqueeze(0)))
        << "step " << step << ": " << b.targets;
    EXPECT_EQ(b.trained_targets, counted[static_cast<size_t>(step)]) << "step " << step;
  }
}

// One example a row, a micro-batch is as wide as its longest row rounded
// up to a multiple of 8, at most T ([Note: padding to the batch]), and
// counts its real input tokens (those with a target: L - 1 of an example
// of L, as packed rows hold). Worked out by hand for T = 32,
// two rows a batch.
TEST(ChatExamples, AMicroBatchIsPaddedToItsLongestRowNotToT) {
  const auto example = [](int32_t first, int32_t n) {
    std::vector<int32_t> e;
    for (int32_t k = 0; k < n; ++k) e.push_back(first + k);
    return e;
  };
  // Lengths 4, 11 (inputs 3 and 10: width 16), 3, 40 (inputs 2 and 32, cut
  // at T + 1: width 32), 9, 5 (inputs 8 and 4: width 8).
  const std::vector<int32_t> lengths = {4, 11, 3, 40, 9, 5};
  std::vector<std::vector<int32_t>> examples;
  std::vector<std::vector<uint8_t>> trained;
  for (size_t e = 0; e < lengths.size(); ++e) {
    examples.push_back(example(static_cast<int32_t>(1 + 100 * e), lengths[e]));
    trained.push_back(std::vector<uint8_t>(static_cast<size_t>(lengths[e]), 1));
  }
  const auto path = example_files("widths", examples, trained);
  const int64_t T = 32;
  auto loader = make(path, 2, T, 0, 1, 1, 1000, 0);
  const std::vector<int64_t> widths = {16, 32, 8}, real = {13, 34, 12};
  for (int64_t step = 0; step < 3; ++step) {
    const auto b = loader.batch(step, 0);
    const auto width = widths[static_cast<size_t>(step)];
    ASSERT_EQ(b.inputs.sizes(), (std::vector<int64_t>{2, width})) << "step " << step;
    ASSERT_EQ(b.targets.sizes(), (std::vector<int64_t>{2, width})) << "step " << step;
    EXPECT_EQ(b.real_tokens, real[static_cast<size_t>(step)]) << "step " << step;
    EXPECT_EQ(b.trained_targets, real[static_cast<size_t>(step)]) << "step " << step;  // every token trained
    for (int64_t row = 0; row < 2; ++row) {
      const auto& e = examples[static_cast<size_t>(2 * step + row)];
      const int64_t n = std::min<int64_t>(static_cast<int64_t>(e.size()), T + 1) - 1;
      for (int64_t k = 0; k < width; ++k) {
        // The example's last token is an input too (its target is padding).
        EXPECT_EQ(b.inputs[row][k].item<int64_t>(), k <= n ? e[static_cast<size_t>(k)] : 0)
            << step << "," << row << "," << k;
        EXPECT_EQ(b.targets[row][k].item<int64_t>(), k < n ? e[static_cast<size_t>(k + 1)] : -100)
            << step << "," << row << "," << k;
      }
    }
  }
  // Where the next batch starts does not move: T tokens a row, as before.
  EXPECT_EQ(loader.offset(1, 0), 2 * T);
}

TEST(ChatExamples, TwoRanksReadWhatOneReadsAndShuffleVisitsEveryExampleOncePerEpoch) {
  std::vector<std::vector<int32_t>> examples;
  std::vector<std::vector<uint8_t>> trained;
  for (int32_t e = 0; e < 7; ++e) {
    examples.push_back({e, static_cast<int32_t>(e + 50), static_cast<int32_t>(e + 60)});
    trained.push_back({0, 1, static_cast<uint8_t>(e % 2)});
  }
  const auto path = example_files("order", examples, trained);
  for (const bool shuffle : {false, true}) {
    auto one = make(path, 2, 4, 0, 1, 1, 100, 3, shuffle);
    auto r0 = make(path, 1, 4, 0, 2, 1, 100, 3, shuffle), r1 = make(path, 1, 4, 1, 2, 1, 100, 3, shuffle);
    std::multiset<int64_t> seen;
    for (int64_t step = 0; step < 7; ++step) {  // 14 rows: two epochs of 7
      const auto whole = one.batch(step, 0);
      EXPECT_TRUE(torch::cat({r0.batch(step, 0).targets, r1.batch(step, 0).targets}).equal(whole.targets));
      for (int64_t b = 0; b < 2; ++b) seen.insert(whole.inputs[b][0].item<int64_t>());
    }
    for (int64_t e = 0; e < 7; ++e) EXPECT_EQ(seen.count(e), 2u) << "example " << e << " shuffle " << shuffle;
  }
}

// Packed: consecutive examples share a row while their inputs (L - 1
// each) fit T; each contributes its first L - 1 tokens as inputs and its
// last L - 1 as targets, positions restart, and the padding after the last
// is a span of its own. Worked out by hand for T = 6.
TEST(ChatExamples, PackedRowsHoldConsecutiveExamplesWithPositionsAndStartsOfTheirOwn) {
  // Examples of 4 (the last two trained), 3 (all), 2 (the last), 9 (all): 3 + 2 + 1 inputs fill
  // the first row; the fourth, cut to T + 1 = 7 tokens, fills the second.
  const auto path = example_files("packed", {{10, 11, 12, 13}, {20, 21, 22}, {30, 31}, {40, 41, 42, 43, 44, 45, 46, 47, 48}},
                                  {{0, 0, 1, 1}, {1, 1, 1}, {0, 1}, {1, 1, 1, 1, 1, 1, 1, 1, 1}});
  const int64_t T = 6;
  auto loader = make(path, 1, T, 0, 1, 1, 100, 0, false, /*pack=*/true);
  EXPECT_TRUE(loader.packed());
  EXPECT_EQ(loader.examples(), 4);
  EXPECT_EQ(loader.rows(), 2);
  const auto first = loader.batch(0, 0);
  EXPECT_TRUE(first.inputs.equal(torch::tensor({{10, 11, 12, 20, 21, 30}}))) << first.inputs;
  EXPECT_TRUE(first.targets.equal(torch::tensor({{-100, 12, 13, 21, 22, 31}}))) << first.targets;
  EXPECT_TRUE(first.positions.equal(torch::tensor({{0, 1, 2, 0, 1, 0}}))) << first.positions;
  EXPECT_TRUE(first.example_starts.equal(torch::tensor({{0, 0, 0, 3, 3, 5}}))) << first.example_starts;
  EXPECT_EQ(first.trained_targets, 5);
  const auto second = loader.batch(1, 0);
  EXPECT_TRUE(second.inputs.equal(torch::tensor({{40, 41, 42, 43, 44, 45}}))) << second.inputs;
  EXPECT_TRUE(second.targets.equal(torch::tensor({{41, 42, 43, 44, 45, 46}}))) << second.targets;
  EXPECT_TRUE(second.positions.equal(torch::tensor({{0, 1, 2, 3, 4, 5}})));
  EXPECT_TRUE(second.example_starts.equal(torch::zeros({1, T}, torch::kLong)));
  // T = 8: the first row's examples (6 inputs) leave two columns of padding.
  auto wide = make(path, 1, 8, 0, 1, 1, 100, 0, false, true);
  const auto padded = wide.batch(0, 0);
  EXPECT_TRUE(padded.inputs.equal(torch::tensor({{10, 11, 12, 20, 21, 30, 0, 0}}))) << padded.inputs;
  EXPECT_TRUE(padded.targets.equal(torch::tensor({{-100, 12, 13, 21, 22, 31, -100, -100}})));
  EXPECT_TRUE(padded.positions.equal(torch::tensor({{0, 1, 2, 0, 1, 0, 0, 1}})));
  EXPECT_TRUE(padded.example_starts.equal(torch::tensor({{0, 0, 0, 3, 3, 5, 6, 6}})));
  // A plain token stream has no examples to pack.
  const auto plain = "/tmp/fsdp-loader-" + std::to_string(::getpid()) + "-plain.bin";
  write_token_file(plain, std::vector<int32_t>(64, 1));
  EXPECT_THROW(make(plain, 1, T, 0, 1, 1, 100, 0, false, true), Error);
}

TEST(ChatExamples, AMaskFromAnotherPrepareIsRefusedNamingIt) {
  const auto path = example_files("stale", {{1, 2, 3}, {4, 5}}, {{0, 1, 1}, {1, 1}});
  write_loss_mask_file(loss_mask_path(path), {kMaskExampleStart, 1, 1});  // 3 bytes for 5 tokens
  try {
    make(path, 1, 4, 0, 1, 1, 100, 0);
    FAIL() << "a mask of another length was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.mask' masks 3 tokens"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("holds 5"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fsdp::data::loader_test
