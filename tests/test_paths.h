// Paths of the build and the checkout that the test programs need: the
// CLI, the workers they launch, the source tree. CMake hands them as
// definitions to test_paths.cpp alone, so every other test source compiles
// to the same command in any clone (the compiler cache) and joins its
// target's unity batches.
#pragma once

namespace fsdp::testing {

extern const char* const kCliProgram;        // build/fsdp
extern const char* const kSourceDir;         // the checkout
extern const char* const kFaultWorker;       // tests/cli/fault_worker.cpp's program
extern const char* const kMixedDtypeWorker;  // tests/core/mixed_dtype_worker.cpp's program
extern const char* const kDcganProgram;      // tests/consumer/dcgan.cpp's program

}  // namespace fsdp::testing
