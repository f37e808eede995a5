// `fsdp ckpt inspect CKPT`, `fsdp ckpt export [--format hf|dcp|safetensors] CKPT OUT`
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
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/common/error.h"
#include "fsdp/io/dir_lock.h"
#include "fsdp/io/input_file.h"
#include "fsdp/models/hf/checkpoint_export.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/models/hf/config_reader.h"
#include "fsdp/train/config.h"
#include "fsdp/train/export.h"
#include "fsdp/train/hf_companions.h"
#include "python_tools.h"

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
  const std::string python = tool_python();
  const std::string script = tool_script("dcp_convert.py");
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

std::string join(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& n : names) text += (text.empty() ? "" : ", ") + n;
  return text;
}

// The model's vocabulary as a Hugging Face config states it (Llama 4 nests
// it in text_config).
int64_t vocab_of(const nlohmann::json& config, const std::string& where) {
  const auto& text = config.contains("text_config") ? config["text_config"] : config;
  FSDP_CHECK(text.contains("vocab_size") && text["vocab_size"].is_number_integer(), where, " states no vocab_size");
  return text["vocab_size"].get<int64_t>();
}

int64_t exported_vocab(const std::string& dir) {
  return vocab_of(io::read_json_file(dir + "/config.json", "exported config"), "'" + dir + "/config.json'");
}

// An explicit --tokenizer must serve the checkpoint's model: refused before
// anything is written.
void check_tokenizer_fits(const std::string& checkpoint, const std::string& tokenizer_dir) {
  const auto meta = checkpoint::read_metadata(checkpoint);
  const auto hf_config = meta.value("hf_config", "");
  if (hf_config.empty()) return;  // export_checkpoint_hf says why there is nothing to export
  const int64_t model_vocab = vocab_of(io::parse_json(hf_config, "checkpoint '" + checkpoint + "''s config"),
                                       "checkpoint '" + checkpoint + "'");
  const auto tokenizer = data::Tokenizer::from_dir(tokenizer_dir);
  FSDP_CHECK(tokenizer->vocab_size() <= model_vocab, "--tokenizer ", tokenizer->source(), " has ",
             tokenizer->vocab_size(), " tokens, more than the vocabulary of ", model_vocab, " of the model in '",
             checkpoint, "': it is not the model's");
}

// The companions of an exported checkpoint, from the run that saved it
// (its recorded configuration names --init-from and the tokenizer), or
// from TOKENIZER when given.
train::CompanionReport write_companions(const std::string& checkpoint, const std::string& out,
                                        const std::string& tokenizer) {
  train::TrainConfig run;
  const auto meta = checkpoint::read_metadata(checkpoint);
  if (const auto yaml = meta.value("config", ""); !yaml.empty()) {
    run.load_yaml_text(yaml, "checkpoint '" + checkpoint + "'");
  }
  auto sources = train::companion_sources(run);
  if (!tokenizer.empty()) sources.tokenizer_dir = tokenizer;
  if (!sources.model_dir.empty() && !std::filesystem::is_directory(sources.model_dir)) {
    std::fprintf(stderr, "warning: the run's --init-from '%s' is not here (relative to %s?): its token ids, "
                 "generation config and chat template are not carried over\n",
                 sources.model_dir.c_str(), std::filesystem::current_path().c_str());
    sources.model_dir.clear();
  }
  // A LoRA adapter directory has no config.json: the vocabulary is the
  // checkpoint's model's.
  const bool has_config = std::filesystem::exists(out + "/config.json");
  const int64_t vocab = has_config ? exported_vocab(out)
                                   : vocab_of(io::parse_json(meta.value("hf_config", "{}"), "checkpoint '" + checkpoint + "''s config"),
                                              "checkpoint '" + checkpoint + "'");
  return train::write_hf_companions(sources, vocab, out);
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
  exp->add_option("out", *out, "output directory (a file for --format safetensors)")->required();
  auto dtype = std::make_shared<std::string>();
  auto shard_size = std::make_shared<std::string>("5GB");
  exp->add_option("--export-dtype,--dtype", *dtype,
                  "float32, bfloat16 or float16 (default: the torch_dtype of the recorded config.json)");
  exp->add_option("--export-shard-size,--max-shard-size", *shard_size,
                  "largest weight file before sharding with an index (5GB, 500MB, 2GiB; default 5GB)");
  auto merge_lora = std::make_shared<bool>(false);
  exp->add_flag("--merge-lora", *merge_lora,
                "a LoRA run's checkpoint: write the model with the adapters folded into its weights (default: a PEFT "
                "adapter directory on the run's base)");
  auto format = std::make_shared<std::string>("hf");
  exp->add_option("--format", *format,
                  "hf: a Hugging Face directory; dcp: a Distributed Checkpoint directory an FSDP2 job loads with "
                  "dcp.load (model, AdamW state, step; tools/dcp_convert.py); safetensors: every parameter whole "
                  "and every buffer as one file OUT (any checkpoint, a library program's too)")
      ->check(CLI::IsMember({"hf", "dcp", "safetensors"}));
  auto tokenizer = std::make_shared<std::string>();
  exp->add_option("--tokenizer", *tokenizer,
                  "tokenizer to write beside the weights (default: the run's: its --tokenizer, else its "
                  "--init-from's, else data/gpt2)");
  exp->callback([from, out, dtype, shard_size, format, tokenizer, merge_lora, &exit_code] {
    // As `fsdp train --export-hf` refuses them: a live job's run folder or
    // checkpoints would have a folder swapped under the running job.
    io::refuse_a_live_jobs_folder(*out, "the export's OUT");
    if (*format == "dcp") {
      // Refused here, before Python and PyTorch start (the converter checks too).
      FSDP_CHECK(!std::filesystem::exists(std::filesystem::symlink_status(*out)), "'", *out,
                 "' exists; DCP output goes to a new folder");
      run_dcp_converter({"export", resolve(*from), *out});
    }
    if (*format == "safetensors") {
      const auto ckpt_path = resolve(*from);
      checkpoint::consolidate_to_safetensors(ckpt_path, *out);
      std::printf("exported %s to %s (every parameter whole, every buffer)\n", ckpt_path.c_str(), out->c_str());
      exit_code = 0;
      return;
    }
    models::HfExportOptions options;
    if (!dtype->empty()) options.dtype = models::hf::parse_export_dtype(*dtype, "--export-dtype");
    options.max_shard_bytes = models::hf::parse_size(*shard_size, "--export-shard-size");
    const auto ckpt_path = resolve(*from);
    if (!tokenizer->empty()) {
      FSDP_CHECK(data::has_tokenizer(*tokenizer), "--tokenizer '", *tokenizer,
                 "' holds neither a tokenizer.json nor GPT-2's BPE files (encoder.json and vocab.bpe, or vocab.json "
                 "and merges.txt)");
      check_tokenizer_fits(ckpt_path, *tokenizer);
    }
    train::CompanionReport report;
    options.companions = [&](const std::string& staged) { report = write_companions(ckpt_path, staged, *tokenizer); };
    // A LoRA run's checkpoint holds its adapters: they go on the run's base.
    const bool lora = train::is_lora_checkpoint(checkpoint::ParameterReader(ckpt_path).metadata());
    FSDP_CHECK(lora || !*merge_lora, "--merge-lora folds a LoRA run's adapters into its base, and '", ckpt_path,
               "' is not a LoRA run's checkpoint; nothing was exported");
    if (lora) {
      const std::string what = train::export_lora_checkpoint(ckpt_path, *out, *merge_lora, options);
      std::printf("exported %s to %s: %s%s\n", ckpt_path.c_str(), out->c_str(), what.c_str(),
                  report.written.empty() ? "" : (" (with " + join(report.written) + ")").c_str());
      exit_code = 0;
      return;
    }
    models::export_checkpoint_hf(ckpt_path, *out, options);
    std::printf("exported %s to %s%s\n", ckpt_path.c_str(), out->c_str(),
                report.written.empty() ? "" : (" (with " + join(report.written) + ")").c_str());
    if (!report.note.empty()) {
      std::fprintf(stderr, "warning: no tokenizer in %s: %s; give `fsdp ckpt export --tokenizer DIR` a matching one\n",
                   out->c_str(), report.note.c_str());
    }
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
  auto trust = std::make_shared<bool>(false);
  imp->add_flag("--trust-dcp-metadata", *trust,
                "load a .metadata that names classes other than DCP's own: a pickle runs the code it names, so "
                "only for a directory of your own (see docs/faults-and-bad-input.md)");
  imp->callback([dcp_dir, into, model_dir, import_format, trust] {
    std::vector<std::string> args{"import", *dcp_dir, *into, "--model", *model_dir};
    if (*trust) args.push_back("--trust-dcp-metadata");
    run_dcp_converter(args);
  });
}

}  // namespace fsdp::cli
