#pragma once
// Loss masks: which tokens of a token file the loss covers, and where each
// example starts. `fsdp data prepare` writes NAME.mask beside NAME.bin for
// chat and instruction data, so the token files stay llm.c's own format
// (its readers see the tokens and nothing else). Light header: no LibTorch.
//
// Format: 256 little-endian int32 ([0] magic 20261129, [1] version 1, [2]
// token count, as many as the token file holds), then one byte per token:
// bit 0, the loss covers predicting this token; bit 1, an example starts
// here.

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::data {

constexpr int32_t kLossMaskMagic = 20261129;
constexpr uint8_t kMaskTrained = 1;
constexpr uint8_t kMaskExampleStart = 2;

// NAME.mask for NAME.bin.
std::string loss_mask_path(const std::string& token_file);

// Atomically.
void write_loss_mask_file(const std::string& path, const std::vector<uint8_t>& mask);

// The mask bytes; throws fsdp::Error naming the file when it is missing,
// not a mask file, or holds another count than `expected_tokens`.
std::vector<uint8_t> read_loss_mask_file(const std::string& path, int64_t expected_tokens);

}  // namespace fsdp::data
