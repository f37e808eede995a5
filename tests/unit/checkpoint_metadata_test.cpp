// A checkpoint's metadata.json is checked field by field: a real one (the
// fuzz seed, written by a save at W=2) passes, and each hostile edit is
// refused naming its field.

#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "fsdp/checkpoint/metadata.h"
#include "fsdp/common/error.h"

namespace fsdp::checkpoint {
namespace {

nlohmann::json real_metadata() {
  std::ifstream in(std::string(FSDP_SOURCE_DIR) + "/tests/fuzz/corpus/checkpoint_metadata/gpt2_tiny_w2.json");
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

std::string refusal(const nlohmann::json& meta) {
  try {
    parse_metadata(meta.dump(), "ckpt/metadata.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(CheckpointMetadata, ARealOneIsAccepted) {
  const auto meta = parse_metadata(real_metadata().dump(), "ckpt/metadata.json");
  const TrainerState state = trainer_state(meta);
  EXPECT_EQ(state.step, 5);
  EXPECT_EQ(state.sharding, "full_shard");
  EXPECT_EQ(meta["world_size"].get<int>(), 2);
  EXPECT_TRUE(state.extra.is_object() && state.extra.empty()) << "a checkpoint without extra state reads as {}";
}

TEST(CheckpointMetadata, AProgramsOwnStateComesBackAsSaved) {
  auto m = real_metadata();
  m["extra"] = {{"next_step", 5}, {"data", {{"shard", 3}, {"offset", 4096}}}};
  const TrainerState state = trainer_state(parse_metadata(m.dump(), "ckpt/metadata.json"));
  EXPECT_EQ(state.extra.at("next_step").get<int>(), 5);
  EXPECT_EQ(state.extra.at("data").at("offset").get<int>(), 4096);
}

TEST(CheckpointMetadata, HostileEditsAreRefusedNamingTheField) {
  auto m = real_metadata();
  m["files"][0]["name"] = "../../etc/passwd";
  EXPECT_EQ(refusal(m), "'ckpt/metadata.json': files[].name '../../etc/passwd' must be a file name inside the "
                        "checkpoint (a damaged or foreign checkpoint)");

  m = real_metadata();
  m["files"][1]["rank"] = 2;
  EXPECT_EQ(refusal(m), "'ckpt/metadata.json': files[].rank is 2, expected 0..1 (a damaged or foreign checkpoint)");

  m = real_metadata();
  m["step"] = "five";
  EXPECT_EQ(refusal(m), "'ckpt/metadata.json': step must be an integer (a damaged or foreign checkpoint)");

  m = real_metadata();
  const std::string name = m["params"].begin().key();
  const int64_t numel = [&] {
    int64_t n = 1;
    for (const auto& d : m["params"][name]["shape"]) n *= d.get<int64_t>();
    return n;
  }();
  m["params"][name]["shards"][0]["count"] = numel + 1;  // beyond the parameter
  EXPECT_NE(refusal(m).find("params['" + name + "'].shards[].count is " + std::to_string(numel + 1)), std::string::npos)
      << refusal(m);

  m = real_metadata();
  m["params"][name]["shape"][0] = -3;
  EXPECT_NE(refusal(m).find("params['" + name + "'].shape[] is -3"), std::string::npos) << refusal(m);

  m = real_metadata();
  m["extra"] = "next_step=5";
  EXPECT_EQ(refusal(m), "'ckpt/metadata.json': extra must be an object (a damaged or foreign checkpoint)");

  m = real_metadata();
  m.erase("trainer");
  EXPECT_EQ(refusal(m), "'ckpt/metadata.json': trainer is missing (a damaged or foreign checkpoint)");

  EXPECT_NE(refusal(nlohmann::json::array()).find("is not fsdp.cpp checkpoint metadata"), std::string::npos);
}

}  // namespace
}  // namespace fsdp::checkpoint
