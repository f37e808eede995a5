// `fsdp ckpt inspect CKPT` and `fsdp ckpt export CKPT OUT`. CKPT is one
// checkpoint (step_N/) or a checkpoint directory, meaning its latest.

#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/common/error.h"
#include "fsdp/models/hf/config_reader.h"

namespace fsdp::cli {
namespace {

std::string resolve(const std::string& path) {
  if (std::filesystem::exists(path + "/metadata.json")) return path;
  if (const auto latest = checkpoint::latest(path)) return *latest;
  throw Error("'" + path + "' is neither a checkpoint (no metadata.json) nor a checkpoint directory (no 'latest')");
}

}  // namespace

void add_ckpt_command(CLI::App& app, int& exit_code) {
  auto* ckpt = app.add_subcommand("ckpt", "inspect and export sharded checkpoints");
  ckpt->require_subcommand(1);

  auto path = std::make_shared<std::string>();
  auto* inspect = ckpt->add_subcommand("inspect", "step, world size, strategy, parameters, sizes, checksums");
  inspect->add_option("checkpoint", *path, "a checkpoint, or a directory of them (its latest)")->required();
  inspect->callback([path, &exit_code] {
    const std::string report = checkpoint::inspect(resolve(*path));
    std::printf("%s", report.c_str());
    exit_code = report.find("DAMAGED") == std::string::npos ? 0 : 1;
  });

  auto from = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto* exp = ckpt->add_subcommand("export", "write a Hugging Face directory (config.json + model.safetensors)");
  exp->add_option("checkpoint", *from, "a checkpoint, or a directory of them (its latest)")->required();
  exp->add_option("out", *out, "output directory")->required();
  auto dtype = std::make_shared<std::string>();
  auto shard_size = std::make_shared<std::string>("5GB");
  exp->add_option("--export-dtype,--dtype", *dtype,
                  "float32, bfloat16 or float16 (default: the torch_dtype of the recorded config.json)");
  exp->add_option("--export-shard-size,--max-shard-size", *shard_size,
                  "largest weight file before sharding with an index (5GB, 500MB, 2GiB; default 5GB)");
  exp->callback([from, out, dtype, shard_size, &exit_code] {
    models::HfExportOptions options;
    if (!dtype->empty()) options.dtype = models::hf::parse_export_dtype(*dtype, "--export-dtype");
    options.max_shard_bytes = models::hf::parse_size(*shard_size, "--export-shard-size");
    const auto ckpt_path = resolve(*from);
    checkpoint::export_hf(ckpt_path, *out, options);
    std::printf("exported %s to %s\n", ckpt_path.c_str(), out->c_str());
    exit_code = 0;
  });
}

}  // namespace fsdp::cli
