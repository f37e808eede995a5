#include "fsdp/train/config.h"

#include <fstream>
#include <functional>
#include <map>

#include <gtest/gtest.h>

#include "fsdp/common/error.h"

namespace fsdp::train {
namespace {

std::string write_yaml(const std::string& text) {
  static int n = 0;
  const std::string path = "/tmp/fsdp-config-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + ".yaml";
  std::ofstream(path) << text;
  return path;
}

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

TEST(Config, YamlSectionsSetFields) {
  TrainConfig c;
  EXPECT_FALSE(c.runtime.keep_denormals) << "subnormals are flushed unless asked";
  c.load_yaml(write_yaml("model:\n  name: llama-tiny\n  activation_checkpoint: true\n"
                         "optim:\n  lr: 1.5e-3\n  lr_schedule: linear\nruntime:\n  steps: 7\n  keep_denormals: true\n"
                         "fsdp:\n  sharding: hybrid_shard\n  fsdp_size: 2\n"));
  EXPECT_EQ(c.model.name, "llama-tiny");
  EXPECT_TRUE(c.model.activation_checkpoint);
  EXPECT_DOUBLE_EQ(c.optim.lr, 1.5e-3);
  EXPECT_EQ(c.optim.lr_schedule, LrScheduleKind::kLinear);
  EXPECT_EQ(name_of(c.optim.lr_schedule), "linear");
  EXPECT_EQ(c.fsdp.sharding, ShardingStrategy::kHybridShard);
  EXPECT_EQ(c.runtime.steps, 7);
  EXPECT_TRUE(c.runtime.keep_denormals);
  EXPECT_EQ(c.fsdp.fsdp_size, 2);
  EXPECT_NO_THROW(c.validate());
}

TEST(Config, UnknownKeyNamesTheClosestValidOne) {
  TrainConfig c;
  expect_error([&] { c.load_yaml(write_yaml("optim:\n  lrr: 0.1\n")); }, {"unknown key 'optim.lrr'", "did you mean 'optim.lr'"});
  expect_error([&] { c.set("runtime.stpes", "3", "--set"); }, {"'runtime.stpes'", "'runtime.steps'"});
  expect_error([&] { c.load_yaml(write_yaml("optimizer:\n  lr: 0.1\n")); }, {"unknown section 'optimizer'", "'optim'"});
  // Nothing close: the keys of its section, never all of them on one line.
  try {
    c.set("optim.momentum", "0.9", "--set");
    ADD_FAILURE();
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what, "--set: unknown key 'optim.momentum' (optim has lr, min_lr_ratio, warmup_steps, lr_schedule, "
                    "weight_decay, beta1, beta2, eps, grad_clip); `fsdp train --help` lists every key");
  }
  expect_error([&] { c.set("runtime.stpes", "3", "--set"); }, {"`fsdp train --help` lists every key"});
}

TEST(Config, WrongTypesAndValuesSayWhatWasExpected) {
  TrainConfig c;
  expect_error([&] { c.load_yaml(write_yaml("runtime:\n  steps: many\n")); },
               {"runtime.steps is 'many'", "expected an integer"});
  expect_error([&] { c.set("optim.lr", "fast", "command line"); }, {"optim.lr is 'fast'", "expected a number"});
  expect_error([&] { c.set("model.chunk_loss", "maybe", "--set"); }, {"true or false"});
  expect_error([&] { c.set("runtime.precision", "bf61", "--set"); }, {"one of fp32, bf16, fp16", "did you mean 'bf16'"});
  expect_error([&] { c.load_yaml(write_yaml("data:\n  seq_len: [1, 2]\n")); }, {"data.seq_len must be a single value"});
  // Found by the config fuzz target: a mapping as a key used to escape as a
  // yaml-cpp exception and terminate the program.
  expect_error([&] { c.load_yaml_text("{ }:\n", "fuzz.yaml"); }, {"fuzz.yaml: line 1: a key must be a plain name, not a mapping"});
  expect_error([&] { c.load_yaml_text("data:\n  [a]: 1\n", "f.yaml"); }, {"f.yaml: line 2: a key must be a plain name, not a list"});
}

TEST(Config, CrossFieldChecks) {
  TrainConfig c;
  c.data.seq_len = 0;
  expect_error([&] { c.validate(); }, {"data.seq_len is 0"});
  TrainConfig h;
  h.fsdp.sharding = ShardingStrategy::kHybridShard;
  expect_error([&] { h.validate(); }, {"fsdp_size"});
}

// Values that passed before and meant nothing (or an overflow further on).
TEST(Config, OptimizerAndSizeValuesOutsideTheirMeaningAreRefused) {
  const std::vector<std::pair<std::function<void(TrainConfig&)>, std::string>> cases = {
      {[](TrainConfig& c) { c.optim.beta1 = 5; }, "optim.beta1 is 5: expected 0 <= beta1 < 1"},
      {[](TrainConfig& c) { c.optim.beta2 = -1; }, "optim.beta2 is -1: expected 0 <= beta2 < 1"},
      {[](TrainConfig& c) { c.optim.eps = -1; }, "optim.eps is -1: expected a small positive number"},
      {[](TrainConfig& c) { c.optim.weight_decay = -0.1; }, "optim.weight_decay is -0.1: expected 0 or more"},
      {[](TrainConfig& c) { c.data.grad_accum = int64_t{1} << 40; },
       "data.grad_accum is 1099511627776: expected at most 1048576"},
      {[](TrainConfig& c) { c.runtime.run_name = ".."; }, "runtime.run_name '..' names no folder of its own"},
      {[](TrainConfig& c) { c.runtime.run_name = "."; }, "runtime.run_name '.' names no folder of its own"},
  };
  for (const auto& [edit, message] : cases) {
    TrainConfig c;
    edit(c);
    expect_error([&] { c.validate(); }, {message});
  }
}

TEST(Config, AKeySetTwiceIsRefusedNamingBothLines) {
  TrainConfig c;
  expect_error([&] { c.load_yaml(write_yaml("optim:\n  lr: 0.1\n  beta1: 0.8\n  lr: 0.2\n")); },
               {"line 4: 'optim.lr' is set again (first at line 2); keep one"});
  expect_error([&] { c.load_yaml(write_yaml("optim:\n  lr: 0.1\ndata:\n  seq_len: 8\noptim:\n  beta1: 0.8\n")); },
               {"line 5: 'optim' is set again (first at line 1)"});
}

TEST(Config, PrintedConfigLoadsBackToTheSameValues) {
  TrainConfig c;
  c.set("model.name", "gpt2", "test");
  c.set("optim.weight_decay", "0.05", "test");
  c.set("sample.prompt", "Fellow citizens: \"hi\"", "test");
  TrainConfig back;
  back.load_yaml(write_yaml(c.to_yaml()));
  EXPECT_EQ(back.to_yaml(), c.to_yaml());
  EXPECT_EQ(back.sample.prompt, "Fellow citizens: \"hi\"");
}

TEST(Config, KeysThatLeftRuntimeStillLoadUnderTheirOldNames) {
  // A config.yaml (or a checkpoint's configuration) written when these keys
  // were all under runtime.
  TrainConfig old;
  old.load_yaml(write_yaml(
      "runtime:\n  steps: 7\n  log_every: 3\n  eval_every: 5\n  eval_batches: 2\n  metrics: m.jsonl\n"
      "  tensorboard: false\n  profile_steps: '2:3'\n  tokenizer: tok\n  sample_tokens: 9\n  sample_prompt: hi\n"
      "  export_hf: hf\n  export_dtype: bfloat16\n  export_shard_size: 1GB\n  max_bad_steps: 4\n  skip_spikes: 6\n"));
  EXPECT_EQ(old.runtime.steps, 7);
  EXPECT_EQ(old.logging.every, 3);
  EXPECT_EQ(old.eval.every, 5);
  EXPECT_EQ(old.eval.batches, 2);
  EXPECT_EQ(old.logging.metrics, "m.jsonl");
  EXPECT_FALSE(old.logging.tensorboard);
  EXPECT_EQ(old.logging.profile_steps, "2:3");
  EXPECT_EQ(old.sample.tokenizer, "tok");
  EXPECT_EQ(old.sample.tokens, 9);
  EXPECT_EQ(old.sample.prompt, "hi");
  EXPECT_EQ(old.hf_export.dir, "hf");
  EXPECT_EQ(old.hf_export.dtype, "bfloat16");
  EXPECT_EQ(old.hf_export.shard_size, "1GB");
  EXPECT_EQ(old.guard.max_bad_steps, 4);
  EXPECT_DOUBLE_EQ(old.guard.skip_spikes, 6);
  // --set takes the old names too; what is written uses the new sections.
  old.set("runtime.sample_tokens", "11", "--set");
  EXPECT_EQ(old.sample.tokens, 11);
  const std::string yaml = old.to_yaml();
  for (const char* section : {"logging:", "eval:", "sample:", "export:", "guard:"}) {
    EXPECT_NE(yaml.find(section), std::string::npos) << section << " in " << yaml;
  }
  EXPECT_EQ(yaml.find("sample_tokens"), std::string::npos) << yaml;
  TrainConfig back;
  back.load_yaml(write_yaml(yaml));
  EXPECT_EQ(back.to_yaml(), yaml);
}

TEST(Config, NumbersOutOfRangeAreRefusedByName) {
  TrainConfig c;
  expect_error([&] { c.set("optim.lr", "1e999", "command line"); }, {"optim.lr is '1e999'", "expected a finite number"});
  expect_error([&] { c.set("optim.beta1", "nan", "--set"); }, {"optim.beta1 is 'nan'", "expected a finite number"});
  expect_error([&] { c.set("runtime.steps", "99999999999999999999", "--set"); },
               {"runtime.steps is '99999999999999999999'", "expected an integer from -2^63 to 2^63-1"});
  EXPECT_DOUBLE_EQ(c.optim.lr, TrainConfig().optim.lr) << "a refused value leaves the key as it was";
}

TEST(Config, NumbersPrintExactlyAndShortly) {
  TrainConfig c;
  c.set("optim.lr", "1.2345678901234567e-4", "test");
  TrainConfig back;
  back.load_yaml_text(c.to_yaml(), "printed");
  EXPECT_EQ(back.optim.lr, c.optim.lr) << "the printed configuration reads back to the same double";
  const std::string yaml = TrainConfig().to_yaml();
  for (const char* line : {"lr: 0.0003\n", "eps: 1e-08\n", "beta2: 0.95\n", "grad_clip: 1\n"}) {
    EXPECT_NE(yaml.find(line), std::string::npos) << line << " in " << yaml;
  }
}

// Every enum key takes each of its spellings and prints it back; name_of
// reads the same table.
TEST(Config, EnumKeysTakeAndPrintEachSpelling) {
  size_t enum_keys = 0;
  for (const auto& key : TrainConfig::describe()) {
    if (key.type.find('|') == std::string::npos) continue;
    ++enum_keys;
    std::string rest = key.type;
    while (!rest.empty()) {
      const auto bar = rest.find('|');
      const std::string spelling = rest.substr(0, bar);
      rest = bar == std::string::npos ? "" : rest.substr(bar + 1);
      TrainConfig c;
      c.set(key.dotted, spelling, "test");
      const std::string line = key.dotted.substr(key.dotted.find('.') + 1) + ": " + spelling + "\n";
      EXPECT_NE(c.to_yaml().find(line), std::string::npos) << line << " in " << c.to_yaml();
    }
  }
  EXPECT_EQ(enum_keys, 8u) << "lr_schedule, precision, sharding, shard_placement, accumulate, on_save_error, "
                              "objective.name, objective.loss";
  EXPECT_EQ(name_of(Accumulate::kSharded), "sharded");
  EXPECT_EQ(name_of(Precision::kFp16), "fp16");
  EXPECT_EQ(name_of(DpoLoss::kIpo), "ipo");
  EXPECT_EQ(name_of(ShardPlacement::kRows), "rows");
  EXPECT_EQ(std::string(to_string(ShardingStrategy::kShardGradOp)), "shard_grad_op");
  EXPECT_EQ(name_of(LrScheduleKind::kConstant), "constant");
  EXPECT_EQ(name_of(OnSaveError::kContinue), "continue");
  TrainConfig c;
  expect_error([&] { c.load_yaml_text("runtime:\n  precision: [bf16]\n", "f.yaml"); },
               {"runtime.precision must be a single value, one of fp32, bf16, fp16"});
}

// The kind each key shows comes from its field's C++ type.
TEST(Config, DescribeGivesTypesAndDefaultsFromTheFields) {
  std::map<std::string, TrainConfig::KeyInfo> by_key;
  for (const auto& key : TrainConfig::describe()) by_key[key.dotted] = key;
  EXPECT_EQ(by_key.size(), TrainConfig::keys().size());
  EXPECT_EQ(by_key["data.seq_len"].type, "INT");
  EXPECT_EQ(by_key["data.seq_len"].default_value, "64");
  EXPECT_EQ(by_key["optim.lr"].type, "FLOAT");
  EXPECT_EQ(by_key["optim.lr"].default_value, "0.0003");
  EXPECT_EQ(by_key["logging.tensorboard"].type, "BOOL");
  EXPECT_TRUE(by_key["logging.tensorboard"].boolean);
  EXPECT_EQ(by_key["logging.tensorboard"].default_value, "true");
  EXPECT_EQ(by_key["model.name"].type, "TEXT");
  EXPECT_EQ(by_key["sample.prompt"].default_value, "\n");
  EXPECT_EQ(by_key["runtime.precision"].type, "fp32|bf16|fp16");
  EXPECT_EQ(by_key["runtime.precision"].default_value, "fp32");
  EXPECT_EQ(by_key["fsdp.sharding"].flag, "--sharding");
}

TEST(Config, VocabSizeOverridesAPresetsRowsAndIsNotNegative) {
  TrainConfig c;
  EXPECT_EQ(c.model.vocab_size, 0) << "0: the preset's own vocabulary";
  c.load_yaml_text("model:\n  name: gpt2-tiny\n  vocab_size: 1024\n", "f.yaml");
  EXPECT_EQ(c.model.vocab_size, 1024);
  EXPECT_NO_THROW(c.validate());
  EXPECT_NE(c.to_yaml().find("vocab_size: 1024\n"), std::string::npos) << c.to_yaml();
  c.set("model.vocab_size", "-1", "command line");
  expect_error([&] { c.validate(); }, {"model.vocab_size is -1", "expected 0"});
  expect_error([&] { c.set("model.vocab_size", "big", "command line"); },
               {"model.vocab_size is 'big'", "expected an integer"});
  bool has_flag = false;
  for (const auto& key : TrainConfig::describe()) has_flag |= key.dotted == "model.vocab_size" && key.flag == "--vocab-size";
  EXPECT_TRUE(has_flag);
}

TEST(Config, DifferencesNameEachChangedKey) {
  TrainConfig a, b;
  EXPECT_TRUE(a.differences(b).empty());
  b.set("optim.lr", "0.001", "test");
  b.set("runtime.precision", "bf16", "test");
  b.set("runtime.run_name", "x", "test");
  const auto d = a.differences(b);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0], "optim.lr: 0.0003 -> 0.001");
  EXPECT_EQ(d[1], "runtime.precision: fp32 -> bf16");
  EXPECT_EQ(d[2], "runtime.run_name: \"\" -> x");
}

TEST(Config, MissingOrInvalidFile) {
  TrainConfig c;
  expect_error([&] { c.load_yaml("/nonexistent/config.yaml"); }, {"cannot open --config file"});
  expect_error([&] { c.load_yaml(write_yaml("model: [unclosed\n")); }, {"not valid YAML"});
}

}  // namespace
}  // namespace fsdp::train
