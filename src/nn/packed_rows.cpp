#include "fsdp/nn/packed_rows.h"

#include "fsdp/common/error.h"

namespace fsdp::nn {
namespace {

thread_local const PackedRows* t_packed_rows = nullptr;

}  // namespace

PackedRowsScope::PackedRowsScope(const PackedRows& rows) : previous_(t_packed_rows) { t_packed_rows = &rows; }
PackedRowsScope::~PackedRowsScope() { t_packed_rows = previous_; }
const PackedRows* PackedRowsScope::current() { return t_packed_rows; }

const PackedRows* packed_rows_for(int64_t B, int64_t T) {
  const PackedRows* rows = t_packed_rows;
  if (rows == nullptr) return nullptr;
  FSDP_CHECK(rows->starts.dim() == 2 && rows->starts.size(0) == B && rows->starts.size(1) == T &&
                 rows->positions.sizes() == rows->starts.sizes(),
             "packed rows of ", rows->starts.sizes(), " for a batch of (", B, ", ", T, ")");
  return rows;
}

}  // namespace fsdp::nn
