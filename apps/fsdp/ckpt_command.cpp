// `fsdp ckpt inspect CKPT`, `fsdp ckpt export [--format hf|dcp] CKPT OUT`
// and `fsdp ckpt import --format dcp DCP OUT --model HF_DIR`. CKPT is one
// checkpoint (step_N/) or a checkpoint directory, meaning its latest.
//
// The DCP formats run tools/dcp_convert.py with the venv's Python: DCP's
// metadata is a pickle of PyTorch's own Python classes, which only the
// installed PyTorch writes and reads reliably (docs/design-notes.md).

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "commands.h"
#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/common/error.h"
#include "fsdp/models/hf/checkpoint_export.h"
#include "fsdp/models/hf/config_reader.h"

namespace fsdp::cli {
namespace {

std::string resolve(const std::string& path) {
  if (std::filesystem::exists(path + "/metadata.json")) return path;
  if (const auto latest = checkpoint::latest(path)) return *latest;
  throw Error("'" + path + "' is neither a checkpoint (no metadata.json) nor a checkpoint directory (no 'latest')");
}

// Replaces this process with tools/dcp_convert.py ARGS under FSDP_PYTHON,
// or the venv's Python this build was configured beside.
[[noreturn]] void run_dcp_converter(const std::vector<std::string>& args) {
  const char* env = std::getenv("FSDP_PYTHON");
  const std::string python = env != nullptr && *env != '\0' ? env : FSDP_VENV_PYTHON;
  const std::string script = std::string(FSDP_SOURCE_DIR) + "/tools/dcp_convert.py";
  FSDP_CHECK(::access(python.c_str(), X_OK) == 0, "the DCP format needs Python with torch and transformers: '", python,
             "' is not there (scripts/setup.sh makes it; FSDP_PYTHON names another)");
  FSDP_CHECK(std::filesystem::exists(script), "the DCP converter '", script, "' is not there (it is in the source tree)");
  std::vector<std::string> all = {python, script};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(nullptr);
  ::execv(python.c_str(), argv.data());
  throw Error("cannot run '" + python + "': " + std::strerror(errno));
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
  auto* exp = ckpt->add_subcommand("export", "write a Hugging Face directory (config.json + model.safetensors) or, "
                                             "with --format dcp, a PyTorch Distributed Checkpoint");
  exp->add_option("checkpoint", *from, "a checkpoint, or a directory of them (its latest)")->required();
  exp->add_option("out", *out, "output directory")->required();
  auto dtype = std::make_shared<std::string>();
  auto shard_size = std::make_shared<std::string>("5GB");
  exp->add_option("--export-dtype,--dtype", *dtype,
                  "float32, bfloat16 or float16 (default: the torch_dtype of the recorded config.json)");
  exp->add_option("--export-shard-size,--max-shard-size", *shard_size,
                  "largest weight file before sharding with an index (5GB, 500MB, 2GiB; default 5GB)");
  auto format = std::make_shared<std::string>("hf");
  exp->add_option("--format", *format,
                  "hf: a Hugging Face directory; dcp: a Distributed Checkpoint directory an FSDP2 job loads with "
                  "dcp.load (model, AdamW state, step; tools/dcp_convert.py)")
      ->check(CLI::IsMember({"hf", "dcp"}));
  exp->callback([from, out, dtype, shard_size, format, &exit_code] {
    if (*format == "dcp") run_dcp_converter({"export", resolve(*from), *out});
    models::HfExportOptions options;
    if (!dtype->empty()) options.dtype = models::hf::parse_export_dtype(*dtype, "--export-dtype");
    options.max_shard_bytes = models::hf::parse_size(*shard_size, "--export-shard-size");
    const auto ckpt_path = resolve(*from);
    models::export_checkpoint_hf(ckpt_path, *out, options);
    std::printf("exported %s to %s\n", ckpt_path.c_str(), out->c_str());
    exit_code = 0;
  });

  auto dcp_dir = std::make_shared<std::string>();
  auto into = std::make_shared<std::string>();
  auto model_dir = std::make_shared<std::string>();
  auto import_format = std::make_shared<std::string>();
  auto* imp = ckpt->add_subcommand("import", "turn an FSDP2 run's Distributed Checkpoint into a checkpoint directory "
                                             "`fsdp train --ckpt-dir` resumes from");
  imp->add_option("dcp", *dcp_dir, "the DCP directory (dcp.save of {model, optim, train_state})")->required();
  imp->add_option("out", *into, "the checkpoint directory to write (new)")->required();
  imp->add_option("--model", *model_dir, "Hugging Face directory whose config.json describes the model")->required();
  imp->add_option("--format", *import_format, "dcp (the only one)")->required()->check(CLI::IsMember({"dcp"}));
  // Every option's target is captured: CLI11 writes into it while parsing.
  imp->callback([dcp_dir, into, model_dir, import_format] {
    run_dcp_converter({"import", *dcp_dir, *into, "--model", *model_dir});
  });
}

}  // namespace fsdp::cli
