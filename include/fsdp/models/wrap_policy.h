#pragma once
// Which modules become FSDP units (FSDP1's auto_wrap_policy): `block`, one
// unit per transformer block and the root for the rest (torchtitan's
// choice), or `size:N`, any candidate module whose own parameters (those
// not in a unit below it) number at least N (size_based_auto_wrap_policy).
// No LibTorch: the config validates it.

#include <cstdint>
#include <string>

namespace fsdp::models {

struct WrapPolicy {
  enum class Kind { kBlock, kSize } kind = Kind::kBlock;
  int64_t min_params = 0;  // kSize
};

// "block" or "size:N" (N a positive integer, 1e6 and 100000 both fine);
// throws naming `flag` and the expected forms.
WrapPolicy parse_wrap_policy(const std::string& text, const std::string& flag);

}  // namespace fsdp::models
