#include "fsdp/core/shard_layout.h"

#include <algorithm>

namespace fsdp {

ShardRange shard_range(int64_t param_offset, int64_t param_numel, int64_t shard_numel, int rank) {
  const int64_t shard_begin = rank * shard_numel;
  const int64_t begin = std::max(param_offset, shard_begin);
  const int64_t end = std::min(param_offset + param_numel, shard_begin + shard_numel);
  ShardRange range;
  if (end > begin) {
    range.begin_in_param = begin - param_offset;
    range.begin_in_shard = begin - shard_begin;
    range.numel = end - begin;
  }
  return range;
}

}  // namespace fsdp
