#include "test_paths.h"

namespace fsdp::testing {

const char* const kCliProgram = FSDP_CLI;
const char* const kSourceDir = FSDP_SOURCE_DIR;
const char* const kFaultWorker = FSDP_FAULT_WORKER;
const char* const kMixedDtypeWorker = FSDP_MIXED_DTYPE_WORKER;
const char* const kDcganProgram = FSDP_DCGAN;

}  // namespace fsdp::testing
