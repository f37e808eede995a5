#pragma once
// Accelerators fsdp plan knows by name: memory per device and dense bf16
// peak, from the vendors' data sheets, for planning a GPU job from any
// machine. Light header: no LibTorch.

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::plan {

struct Device {
  std::string name;         // as --device spells it
  std::string description;  // the product
  int64_t memory_bytes = 0;
  double bf16_tflops = 0;  // dense, without sparsity
};

const std::vector<Device>& known_devices();
// Throws fsdp::Error listing the known names (and the closest) for others.
const Device& find_device(const std::string& name);

}  // namespace fsdp::plan
