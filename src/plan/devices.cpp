#include "fsdp/plan/devices.h"

#include "fsdp/common/error.h"
#include "fsdp/common/suggest.h"

namespace fsdp::plan {

const std::vector<Device>& known_devices() {
  constexpr double GiB = 1024.0 * 1024 * 1024;
  const auto gib = [](double g) { return static_cast<int64_t>(g * GiB); };
  // Memory as CUDA reports it where that is known (an "80 GB" H100 shows
  // 79.2 GiB), else the data sheet's; bf16 dense tensor-core peaks.
  static const std::vector<Device> devices = {
      {"h100", "NVIDIA H100 SXM 80GB", gib(79.2), 989},
      {"h100-96gb", "NVIDIA H100 96GB (torchtitan's published runs)", gib(94.5), 989},
      {"h100-pcie", "NVIDIA H100 PCIe 80GB", gib(79.2), 756},
      {"h200", "NVIDIA H200 SXM 141GB", gib(139.8), 989},
      {"b200", "NVIDIA B200 180GB", gib(178.0), 2250},
      {"a100-80gb", "NVIDIA A100 SXM 80GB", gib(79.1), 312},
      {"a100-40gb", "NVIDIA A100 SXM 40GB", gib(39.4), 312},
      {"l40s", "NVIDIA L40S 48GB", gib(44.4), 362},
      {"a10g", "NVIDIA A10G 24GB", gib(22.0), 70},
      {"rtx4090", "NVIDIA GeForce RTX 4090 24GB", gib(23.6), 165},
      {"mi300x", "AMD Instinct MI300X 192GB", gib(191.5), 1307},
  };
  return devices;
}

const Device& find_device(const std::string& name) {
  std::vector<std::string> names;
  for (const auto& d : known_devices()) {
    if (d.name == name) return d;
    names.push_back(d.name);
  }
  throw Error("--device '" + name + "' is not known" + did_you_mean(name, names) +
              "; known devices: " + join_words(names));
}

}  // namespace fsdp::plan
