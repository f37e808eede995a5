#include "fsdp/train/config.h"

#include <fstream>

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
  EXPECT_EQ(c.fsdp.sharding, Sharding::kHybridShard);
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
  h.fsdp.sharding = Sharding::kHybridShard;
  expect_error([&] { h.validate(); }, {"fsdp_size"});
}

TEST(Config, PrintedConfigLoadsBackToTheSameValues) {
  TrainConfig c;
  c.set("model.name", "gpt2", "test");
  c.set("optim.weight_decay", "0.05", "test");
  c.set("runtime.sample_prompt", "Fellow citizens: \"hi\"", "test");
  TrainConfig back;
  back.load_yaml(write_yaml(c.to_yaml()));
  EXPECT_EQ(back.to_yaml(), c.to_yaml());
  EXPECT_EQ(back.runtime.sample_prompt, "Fellow citizens: \"hi\"");
}

TEST(Config, MissingOrInvalidFile) {
  TrainConfig c;
  expect_error([&] { c.load_yaml("/nonexistent/config.yaml"); }, {"cannot read"});
  expect_error([&] { c.load_yaml(write_yaml("model: [unclosed\n")); }, {"not valid YAML"});
}

}  // namespace
}  // namespace fsdp::train
