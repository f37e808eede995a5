#pragma once
// Flags every distributed subcommand shares (--device, --backend, --timeout) and the
// start-up sequence they imply.

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "fsdp/distributed/process_group.h"

namespace fsdp::cli {

struct DistFlags {
  std::string device;     // empty: FSDP_DEVICE, else auto
  std::string backend;    // empty: FSDP_BACKEND, else the device's
  double timeout_s = 0;   // 0: FSDP_TIMEOUT, else the default

  void add_to(CLI::App& command);
  // Reads the launcher's environment, applies threads and the BLAS check,
  // and connects all ranks.
  std::shared_ptr<dist::World> init_world() const;
};

}  // namespace fsdp::cli
