#pragma once
// A checkpoint's metadata.json: what it records and how it is checked when
// read. Light header (no LibTorch): the fuzz target links it alone.
//
// Everything load, inspect and export read from the metadata is validated
// here, once: types, ranges (ranks below world_size, element ranges inside
// their parameter) and file names (plain names inside the checkpoint, never
// a path elsewhere). A hostile or damaged file is refused with one message
// naming the field; nothing later trusts an unchecked value.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fsdp::checkpoint {

inline constexpr const char* kMetadataFormat = "fsdp.cpp-checkpoint";
inline constexpr int kMetadataVersion = 1;

struct TrainerState {
  int64_t step = 0;          // optimizer steps completed
  int64_t tokens_seen = 0;
  double loss_scale = 0;     // fp16 grad scaler (0: none)
  std::string config_yaml;   // the effective configuration
  std::string hf_config;     // the architecture, as Hugging Face config.json
  std::string sharding;      // strategy name at save time
  std::vector<int64_t> mesh; // (replicate, shard) at save time
  // Whatever else the program records (a JSON object): its own counters,
  // where its data stands. The trainer leaves it empty.
  nlohmann::json extra = nlohmann::json::object();
};

// Parses and validates metadata text; `path` names it in errors. Throws
// fsdp::Error.
nlohmann::json parse_metadata(const std::string& text, const std::string& path);

// CHECKPOINT/metadata.json, validated; throws naming the file.
nlohmann::json read_metadata(const std::string& checkpoint);

// The trainer's part of validated metadata.
TrainerState trainer_state(const nlohmann::json& meta);

}  // namespace fsdp::checkpoint
