#pragma once
// Where a parameter's elements live once its unit is sharded: the unit's
// parameters are laid end to end in one flat buffer, padded to a multiple of
// the shard-group size W, and rank r holds [r*S, (r+1)*S), S = padded / W.
// Pure arithmetic, tested on its own. Light header: no LibTorch.

#include <cstdint>

namespace fsdp {

struct ShardRange {
  int64_t begin_in_param = 0;  // first element of the parameter (flattened) held here
  int64_t begin_in_shard = 0;  // where it sits in this rank's shard
  int64_t numel = 0;           // 0 when this rank holds none of the parameter
};

// The part of elements [param_offset, param_offset + param_numel) of the flat
// buffer that rank `rank` holds, with shards of `shard_numel` elements.
ShardRange shard_range(int64_t param_offset, int64_t param_numel, int64_t shard_numel, int rank);

// Whether parameters can stay sharded over groups of `ranks` consecutive
// ranks of a shard group of `shard_group_size` between forward and
// backward (reshard_after_forward = k): k divides the group. 0 fits any
// group: fully_shard reads it as the whole group, the trainer's config as
// "the strategy decides". The one rule, for fully_shard, its setter, the
// trainer's config and the planner.
inline bool reshard_ranks_fit(int64_t ranks, int64_t shard_group_size) {
  return ranks == 0 || (ranks >= 1 && shard_group_size % ranks == 0);
}

}  // namespace fsdp
