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
// Version 2 adds "checksum", a CRC-32 of everything else in the file
// ([Note: sealed metadata]); version 1 files (older saves) are read
// without one. Version 3 holds any optimizer ("optimizers": kind,
// hyperparameters, per-parameter step and state tensors, where versions
// 1-2 held one AdamW's step as params[].adam_step), the buffers
// ("buffers", "buffer_file") and the program's states ("states").
inline constexpr int kMetadataVersion = 3;
// The largest step, tokens_seen or adam_step a checkpoint may record: far
// past any run, and far enough inside int64 that the arithmetic they feed
// (data positions, schedules, bias corrections) cannot overflow.
inline constexpr int64_t kMaxCheckpointCount = int64_t{1} << 62;

struct TrainerState {
  int64_t step = 0;          // optimizer steps completed
  int64_t tokens_seen = 0;
  double loss_scale = 0;     // fp16 grad scaler (0: none)
  std::string config_yaml;   // the effective configuration
  std::string hf_config;     // the architecture, as Hugging Face config.json
  // How the model was sharded at save time, as the library found it (save
  // records its own; load reports it): the strategy's name ("replicate" and
  // "unsharded" for modules without units) and the mesh (replicate, shard).
  std::string sharding;
  std::vector<int64_t> mesh;
  // Whatever else the program records (a JSON object): its own counters,
  // where its data stands. The trainer leaves it empty.
  nlohmann::json extra = nlohmann::json::object();
};

// [Note: sealed metadata]
// Resume trusts metadata.json for the step, the tokens seen, AdamW's step
// per parameter (any optimizer's), the mesh and which file holds which elements; the rank
// files' CRCs are in it too. An edit there (tokens_seen, adam_step = 2^62,
// world_size) would pass every range check and train differently, so the
// file carries "checksum": "crc32:XXXXXXXX" of its compact JSON dump without
// that key (nlohmann's dump is canonical: keys sorted, numbers written to
// round-trip), and a file whose checksum does not match is refused.

// The text of metadata.json for `meta`, with its checksum.
std::string sealed_metadata_text(nlohmann::json meta);

// Parses and validates metadata text; `path` names it in errors. Throws
// fsdp::Error.
nlohmann::json parse_metadata(const std::string& text, const std::string& path);

// CHECKPOINT/metadata.json, validated; throws naming the file.
nlohmann::json read_metadata(const std::string& checkpoint);

// The trainer's part of validated metadata.
TrainerState trainer_state(const nlohmann::json& meta);

}  // namespace fsdp::checkpoint
