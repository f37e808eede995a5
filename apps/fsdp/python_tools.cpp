// [Note: paths in definitions] (CMakeLists.txt): this file alone gets the
// checkout's paths, so the commands that use them compile to the same
// command in any clone and join the CLI's unity batches.

#include "python_tools.h"

#include <cstdlib>

namespace fsdp::cli {

std::string tool_python() {
  const char* env = std::getenv("FSDP_PYTHON");
  return env != nullptr && *env != '\0' ? env : FSDP_VENV_PYTHON;
}

std::string tool_script(const std::string& name) { return std::string(FSDP_SOURCE_DIR) + "/tools/" + name; }

}  // namespace fsdp::cli
