// The checkout's Python tools (tools/*.py) that some commands run: Parquet
// reading for `data prepare`, the DCP converter for `ckpt`.
#pragma once

#include <string>

namespace fsdp::cli {

// FSDP_PYTHON, or the venv's Python this build was configured beside.
std::string tool_python();

// tools/NAME in the source tree this build came from.
std::string tool_script(const std::string& name);

}  // namespace fsdp::cli
