#pragma once
// The job store of `fsdp launch --max-restarts` on LibTorch's TCPStore.

#include <chrono>
#include <memory>
#include <string>

#include "fsdp/launch/launcher.h"

namespace fsdp::launch {

// Serves (`serve`: node 0) or joins the store at addr:port. Throws
// fsdp::Error naming the address when it cannot.
std::unique_ptr<JobStore> open_tcp_job_store(const std::string& addr, int port, bool serve,
                                             std::chrono::milliseconds timeout);

}  // namespace fsdp::launch
