// A checkpoint's metadata.json is checked field by field: a real one (the
// fuzz seed, written by a save at W=2) passes, and each hostile edit is
// refused naming its field.

#include <zlib.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>

#include <gtest/gtest.h>

#include "../test_paths.h"
#include "fsdp/checkpoint/metadata.h"
#include "fsdp/common/error.h"

namespace fsdp::checkpoint {
namespace {

nlohmann::json seed(const std::string& name) {
  std::ifstream in(std::string(fsdp::testing::kSourceDir) + "/tests/fuzz/corpus/checkpoint_metadata/" + name);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

// A version-1 save of the trainer (AdamW's steps as params[].adam_step).
nlohmann::json real_metadata() { return seed("gpt2_tiny_w2.json"); }
// A version-3 save of tests/consumer/dcgan.cpp under replicate: two
// models with buffers, two Adams, a scheduler's and the program's states.
nlohmann::json version_3_metadata() { return seed("dcgan_replicate_w2.json"); }

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

// [Note: sealed metadata]: what a save writes carries a CRC-32 of the rest,
// and an edit to anything resume reads is refused naming the checksum.
TEST(CheckpointMetadata, SealedMetadataRefusesEveryEditResumeWouldBelieve) {
  auto m = real_metadata();
  m["version"] = 2;  // the seal came with version 2; the seed is a version-1 save
  const std::string text = sealed_metadata_text(m);
  // The documented format, computed here with zlib: crc32 of the compact dump without the key.
  const auto crc = ::crc32(0L, reinterpret_cast<const Bytef*>(m.dump().data()), static_cast<uInt>(m.dump().size()));
  char expected[32];
  std::snprintf(expected, sizeof(expected), "crc32:%08lx", static_cast<unsigned long>(crc));
  const auto sealed = nlohmann::json::parse(text);
  EXPECT_EQ(sealed["checksum"], expected);
  EXPECT_NO_THROW(parse_metadata(text, "ckpt/metadata.json"));
  // Whitespace is no content: the same JSON written another way still passes.
  EXPECT_NO_THROW(parse_metadata(sealed.dump(4), "ckpt/metadata.json"));

  const std::string name = m["params"].begin().key();
  const std::vector<std::pair<std::string, std::function<void(nlohmann::json&)>>> edits = {
      {"tokens_seen", [](nlohmann::json& j) { j["trainer"]["tokens_seen"] = 123456; }},
      {"adam_step", [&](nlohmann::json& j) { j["params"][name]["adam_step"] = int64_t{1} << 62; }},
      {"world_size", [](nlohmann::json& j) { j["world_size"] = 1 << 20; }},
      {"mesh", [](nlohmann::json& j) { j["mesh"] = {2, 1}; }},
      {"a file's crc32", [](nlohmann::json& j) { j["files"][0]["crc32"] = 7; }},
      {"the step", [](nlohmann::json& j) { j["step"] = 6; }},
  };
  for (const auto& [what, edit] : edits) {
    auto edited = sealed;
    edit(edited);
    EXPECT_NE(refusal(edited).find("'ckpt/metadata.json': its checksum " + std::string(expected) +
                                   " does not match its contents"),
              std::string::npos)
        << what << ": " << refusal(edited);
  }
  auto unsealed = sealed;
  unsealed.erase("checksum");
  EXPECT_EQ(refusal(unsealed), "'ckpt/metadata.json': checksum is missing (a damaged or foreign checkpoint)");
  // A save made before version 2 has no checksum and is read as it was.
  EXPECT_NO_THROW(parse_metadata(real_metadata().dump(), "ckpt/metadata.json"));
}

// The seal stops accidents, not a forger ([Note: sealed metadata]): a
// resealed file, or a version-1 one without a seal, whose counts could not
// be computed with is refused by their ranges, naming the field. A
// tokens_seen of 2^63 - 1 crashed a resume before.
TEST(CheckpointMetadata, ForgedCountsAndMeshesAreRefusedWithOrWithoutTheSeal) {
  const std::string name = real_metadata()["params"].begin().key();
  const std::vector<std::pair<std::string, std::function<void(nlohmann::json&)>>> forgeries = {
      {"trainer.tokens_seen is 9223372036854775807, expected 0..4611686018427387904",
       [](nlohmann::json& j) { j["trainer"]["tokens_seen"] = INT64_MAX; }},
      {"step is 9223372036854775807, expected 0..4611686018427387904",
       [](nlohmann::json& j) { j["step"] = INT64_MAX; }},
      {"adam_step is 4611686018427387905", [&](nlohmann::json& j) {
         j["params"][name]["adam_step"] = (int64_t{1} << 62) + 1;
       }},
      {"mesh holds 21 ranks, but world_size is 2", [](nlohmann::json& j) { j["mesh"] = {3, 7}; }},
      {"mesh[] is 0", [](nlohmann::json& j) { j["mesh"] = {0, 2}; }},
  };
  for (const bool sealed : {false, true}) {
    for (const auto& [expected, forge] : forgeries) {
      auto m = real_metadata();
      forge(m);
      if (sealed) {
        m["version"] = 2;
        m = nlohmann::json::parse(sealed_metadata_text(m));
      }
      EXPECT_NE(refusal(m).find(expected), std::string::npos) << (sealed ? "sealed: " : "version 1: ") << refusal(m);
    }
  }
  // The largest counts a checkpoint may hold are accepted.
  auto m = real_metadata();
  m["trainer"]["tokens_seen"] = kMaxCheckpointCount;
  m["step"] = kMaxCheckpointCount;
  EXPECT_EQ(refusal(m), "(accepted)");
}

TEST(CheckpointMetadata, Version3sOptimizersBuffersAndStatesAreChecked) {
  const auto real = version_3_metadata();
  ASSERT_EQ(real["version"].get<int>(), 3);
  const TrainerState state = trainer_state(parse_metadata(real.dump(), "ckpt/metadata.json"));
  EXPECT_EQ(state.sharding, "replicate");
  EXPECT_EQ(state.mesh, (std::vector<int64_t>{2, 1}));
  const std::string param = real["optimizers"]["generator_adam"]["state"].begin().key();
  const std::vector<std::pair<std::string, std::function<void(nlohmann::json&)>>> edits = {
      {"optimizers['generator_adam'].kind must be one of sgd, adam, adamw, rmsprop, adagrad",
       [](nlohmann::json& j) { j["optimizers"]["generator_adam"]["kind"] = "lbfgs"; }},
      {"optimizers['generator_adam'].state names 'nowhere.weight', which is no saved parameter",
       [](nlohmann::json& j) { j["optimizers"]["generator_adam"]["state"]["nowhere.weight"] = {{"step", 1}, {"tensors", {"exp_avg"}}}; }},
      {"optimizers['generator_adam'].state['" + param + "'].step is 4611686018427387905",
       [&](nlohmann::json& j) { j["optimizers"]["generator_adam"]["state"][param]["step"] = (int64_t{1} << 62) + 1; }},
      {"optimizers['generator_adam'].state['" + param + "'].tensors[] holds a name with a control character or '/'",
       [&](nlohmann::json& j) { j["optimizers"]["generator_adam"]["state"][param]["tensors"] = {"../exp_avg"}; }},
      {"optimizers['generator_adam'].groups[].params[] must name a saved parameter",
       [](nlohmann::json& j) { j["optimizers"]["generator_adam"]["groups"][0]["params"].push_back("nowhere.weight"); }},
      {"buffer_file is missing, and buffers are listed", [](nlohmann::json& j) { j.erase("buffer_file"); }},
      {"buffer_file.name '../rank_00000.safetensors' must be a file name inside the checkpoint",
       [](nlohmann::json& j) { j["buffer_file"]["name"] = "../rank_00000.safetensors"; }},
      {"states must be an object", [](nlohmann::json& j) { j["states"] = "program"; }},
      {"optimizers is missing", [](nlohmann::json& j) { j.erase("optimizers"); }},
      {"has version 4, this build reads versions 1 to 3", [](nlohmann::json& j) { j["version"] = 4; }},
  };
  for (const auto& [expected, edit] : edits) {
    auto m = real;
    edit(m);
    m = nlohmann::json::parse(sealed_metadata_text(m));  // a forger reseals: the field checks still hold
    EXPECT_NE(refusal(m).find(expected), std::string::npos) << expected << "\n" << refusal(m);
  }
}

}  // namespace
}  // namespace fsdp::checkpoint
