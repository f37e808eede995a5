// `fsdp plan`: predicted per-rank memory for a training job, by part, and
// with --budget (or --device) the configuration that fits.

#include <cstdio>
#include <optional>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "fsdp/common/error.h"
#include "fsdp/models/hf/shard_index.h"
#include "fsdp/plan/devices.h"
#include "fsdp/plan/model_shape.h"
#include "fsdp/plan/runtime_overhead.h"
#include "fsdp/plan/search.h"
#include "train_flags.h"

namespace fsdp::cli {
namespace {

struct PlanFlags {
  int world_size = 1;
  std::string budget;
  std::string device;
  std::string overhead;
  double headroom = -1;  // negative: the target's default
  bool selective_ac = false;
  bool json = false;
};

std::string job_line(const plan::ModelShape& m, const train::TrainConfig& job, int world, bool selective, bool gpu) {
  char text[512];
  std::snprintf(text, sizeof(text),
                "%s model, %lld layers, width %lld, vocabulary %lld; %d rank%s, %s; %s; micro-batch %lld x %lld "
                "tokens, %lld micro-step%s%s; prefetch %lld; activation checkpointing %s; chunked loss %s",
                m.family.c_str(), static_cast<long long>(m.layers), static_cast<long long>(m.hidden),
                static_cast<long long>(m.vocab), world, world == 1 ? "" : "s",
                (to_string(job.fsdp.sharding) +
                 (job.fsdp.sharding == ShardingStrategy::kHybridShard ? " " + std::to_string(job.fsdp.fsdp_size) : "") +
                 (job.fsdp.reshard_after_forward > 0
                      ? ", blocks kept over " + std::to_string(job.fsdp.reshard_after_forward) + " ranks after forward"
                      : ""))
                    .c_str(),
                train::name_of(job.runtime.precision).c_str(), static_cast<long long>(job.data.batch_size),
                static_cast<long long>(job.data.seq_len), static_cast<long long>(job.data.grad_accum),
                job.data.grad_accum == 1 ? "" : "s",
                job.data.grad_accum == 1 ? ""
                : job.fsdp.accumulate == train::Accumulate::kSharded ? " accumulated sharded"
                                                                     : " accumulated unsharded",
                static_cast<long long>(job.fsdp.prefetch_depth),
                selective                         ? "selective (op)"
                : job.model.activation_checkpoint ? "on"
                                                  : "off",
                gpu                    ? "off (a CPU kernel)"
                : job.model.chunk_loss ? "on"
                                       : "off");
  std::string line = text;
  if (job.objective.name == train::ObjectiveKind::kDpo) {
    line += job.lora.rank == 0 ? "; DPO: 2 rows a pair, and a frozen reference model sharded as the policy is"
                               : "; DPO: 2 rows a pair, the reference the starting adapters on the same base (no copy)";
  }
  if (job.lora.rank == 0) return line;
  // LoRA: the trainable share, the frozen base's dtype.
  int64_t all = m.root_params, trainable = m.root_trainable;
  for (size_t i = 0; i < m.block_params.size(); ++i) {
    all += m.block_params[i];
    trainable += m.block_trainable[i];
  }
  char lora[192];
  std::snprintf(lora, sizeof(lora), "; LoRA rank %lld: %lld trainable parameters of %lld, the frozen base in %s",
                static_cast<long long>(job.lora.rank), static_cast<long long>(trainable), static_cast<long long>(all),
                job.runtime.precision == train::Precision::kFp32 ? "fp32" : "bf16");
  return line + std::string(lora);
}

void print_table(const plan::Prediction& p, int64_t overhead, const std::string& overhead_source, double headroom,
                 const std::string& headroom_source) {
  std::printf("per-rank memory at the peak (%s):\n", p.peak.phase.c_str());
  const auto row = [](const std::string& name, int64_t bytes) {
    std::printf("  %-52s %12s\n", name.c_str(), plan::format_bytes(bytes).c_str());
  };
  for (const auto& part : p.peak.parts) row(part.name, part.bytes);
  row("tensors", p.peak.total());
  char margin[96];
  std::snprintf(margin, sizeof(margin), "allocator headroom, %.0f%% (%s)", headroom * 100, headroom_source.c_str());
  row(margin, plan::with_headroom(p.peak.total(), headroom) - p.peak.total());
  row("runtime overhead (" + overhead_source + ")", overhead);
  row("total", plan::with_headroom(p.peak.total(), headroom) + overhead);
}

nlohmann::json to_json(const plan::Prediction& p, int64_t overhead, double headroom) {
  nlohmann::json parts = nlohmann::json::object();
  for (const auto& part : p.peak.parts) parts[part.name] = part.bytes;
  nlohmann::json host_parts = nlohmann::json::object();
  for (const auto& part : p.host_parts) host_parts[part.name] = part.bytes;
  nlohmann::json timeline = nlohmann::json::array();
  for (const auto& m : p.timeline) timeline.push_back({{"phase", m.phase}, {"bytes", m.total()}});
  return {{"block_activation_bytes", p.block_activation_bytes},
          {"block_checkpointed_bytes", p.block_checkpointed_bytes},
          {"peak_phase", p.peak.phase},
          {"worst_routing_tensor_peak_bytes", p.worst_routing_peak_bytes},
          {"tensor_peak_bytes", p.peak.total()},
          {"overhead_bytes", overhead},
          {"tensors_plus_overhead_bytes", p.peak.total() + overhead},
          {"headroom", headroom},
          {"total_bytes", plan::with_headroom(p.peak.total(), headroom) + overhead},
          {"state_bytes", p.state_bytes},
          {"host_bytes", p.host_bytes},
          {"host_parts", host_parts},
          {"parts", parts},
          {"timeline", timeline}};
}

int run_plan(const TrainFlags& flags, const PlanFlags& pf) {
  const train::TrainConfig job = resolve(flags);
  FSDP_CHECK(pf.world_size >= 1, "--world-size ", pf.world_size, ": expected at least 1");
  const plan::Device* device = pf.device.empty() ? nullptr : &plan::find_device(pf.device);
  plan::Target target;
  target.flash_attention = target.composite_loss = target.composite_elementwise = device != nullptr;
  target.selective_checkpointing = pf.selective_ac;
  const plan::ModelShape shape = plan::model_shape(job);
  const plan::Prediction prediction = plan::predict(shape, job, pf.world_size, target);

  int64_t overhead = 0;
  std::string overhead_source;
  if (!pf.overhead.empty()) {
    overhead = models::hf::parse_size(pf.overhead, "--overhead", /*allow_zero=*/true);
    overhead_source = "--overhead";
  } else if (device != nullptr) {
    overhead_source = "not counted: CUDA context, NCCL";
  } else {
    overhead = plan::measure_runtime_overhead(job.runtime.precision == train::Precision::kBf16);
    overhead_source = "measured here";
  }
  // On CPU, the largest gap between peak RSS and tensors plus overhead in
  // bench/memory_validation.py's grid, as a share of the tensors, by
  // precision, over the rows with at least 100 MiB of tensors
  // (docs/memory.md): 41.5% in fp32, 84.9% in bf16, rounded up.
  const bool bf16 = job.runtime.precision == train::Precision::kBf16;
  const double cpu_headroom = bf16 ? 0.85 : 0.45;
  const double headroom = pf.headroom >= 0 ? pf.headroom / 100 : device != nullptr ? 0.10 : cpu_headroom;
  const std::string headroom_source = pf.headroom >= 0    ? "--headroom"
                                      : device != nullptr ? "assumed for CUDA's allocator"
                                                          : "the most measured here";
  int64_t budget = 0;
  if (!pf.budget.empty())
    budget = models::hf::parse_size(pf.budget, "--budget");
  else if (device != nullptr)
    budget = device->memory_bytes;

  const auto nothing_fits = [&](const plan::Choice& choice) {
    return Error("no configuration fits " + plan::format_bytes(budget) + " per rank: the smallest (" +
                 plan::train_flags(choice.smallest.job) + ") needs " + plan::format_bytes(choice.smallest.peak_bytes) +
                 "; add ranks, shorten --seq-len, or raise the budget");
  };
  if (pf.json) {
    nlohmann::json out = to_json(prediction, overhead, headroom);
    std::optional<plan::Choice> choice;
    if (budget > 0) {
      choice = plan::choose(shape, job, pf.world_size, target, budget, overhead, headroom);
      out["budget_bytes"] = budget;
      out["fits"] = plan::with_headroom(prediction.peak.total(), headroom) + overhead <= budget;
      out["chosen"] = choice->best ? nlohmann::json(plan::train_flags(choice->best->job)) : nlohmann::json();
    }
    std::printf("%s\n", out.dump(2).c_str());
    if (choice && !choice->best) throw nothing_fits(*choice);
    return 0;
  }
  std::printf("%s\n", job_line(shape, job, pf.world_size, pf.selective_ac, device != nullptr).c_str());
  if (device != nullptr) {
    std::printf("device: %s, %s; flash attention and PyTorch's composite loss assumed%s\n", device->description.c_str(),
                plan::format_bytes(device->memory_bytes).c_str(),
                pf.selective_ac ? ", selective (op) checkpointing" : "");
  }
  print_table(prediction, overhead, overhead_source, headroom, headroom_source);
  if (job.model.dropout > 0) std::printf("note: dropout's masks (--dropout) are not counted\n");
  if (job.fsdp.shard_placement != train::ShardPlacement::kFlat && plan::shard_group_size(job, pf.world_size) > 1) {
    std::printf("note: planned as --shard-placement flat; rows also holds each gather in flight and each "
                "reduce-scatter's input a second time, in rank-major order, and pads each parameter on its own\n");
  }
  std::printf("sharded state (parameters, gradients, AdamW): %s\n", plan::format_bytes(prediction.state_bytes).c_str());
  if (prediction.host_bytes > 0) {
    std::printf("host memory per rank: %s (%s; not in the table above, which is the compute device's)\n",
                plan::format_bytes(prediction.host_bytes).c_str(),
                job.fsdp.cpu_offload ? "--cpu-offload: the sharded state"
                                     : "--optimizer-offload: AdamW's moments and the fp32 copies a step updates");
  }
  std::printf("activations per block (the largest): %s kept without checkpointing, %s with it (%s)\n",
              plan::format_bytes(prediction.block_activation_bytes).c_str(),
              plan::format_bytes(prediction.block_checkpointed_bytes).c_str(),
              pf.selective_ac ? "selective: the input, every other matmul's output, the attention's"
                              : "the input; the block being recomputed holds all of its own");
  if (prediction.worst_routing_peak_bytes > 0) {
    std::printf("experts at the expected load (balanced routing); if one expert got every token: %s of tensors\n",
                plan::format_bytes(prediction.worst_routing_peak_bytes).c_str());
  }
  if (budget == 0) return 0;

  const auto choice = plan::choose(shape, job, pf.world_size, target, budget, overhead, headroom);
  std::printf("\nbudget %s: this configuration %s\n", plan::format_bytes(budget).c_str(),
              plan::with_headroom(prediction.peak.total(), headroom) + overhead <= budget ? "fits" : "does not fit");
  if (!choice.best) throw nothing_fits(choice);
  const std::string launch = pf.world_size > 1 ? "fsdp launch -n " + std::to_string(pf.world_size) + " -- " : "";
  const std::string model =
      job.model.init_from.empty() ? "--model " + job.model.name : "--init-from " + job.model.init_from;
  std::printf("chosen (%s): %sfsdp train %s %s\n", plan::format_bytes(choice.best->peak_bytes).c_str(), launch.c_str(),
              model.c_str(), plan::train_flags(choice.best->job).c_str());
  if (pf.selective_ac) {
    std::printf(
        "(planned with torchtitan's selective checkpointing, which fsdp train does not have: its "
        "--activation-checkpoint recomputes whole blocks)\n");
  }
  std::printf("the others, each at its best micro-batch:\n");
  for (const auto& c : choice.groups) {
    if (plan::train_flags(c.job) == plan::train_flags(choice.best->job)) continue;
    std::printf("  %-10s %s: %s\n", plan::format_bytes(c.peak_bytes).c_str(), plan::train_flags(c.job).c_str(),
                plan::why_not(c, *choice.best, budget).c_str());
  }
  return 0;
}

}  // namespace

void add_plan_command(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<TrainFlags>();
  auto pf = std::make_shared<PlanFlags>();
  auto* cmd = app.add_subcommand(
      "plan", "predict a training job's memory per rank, by part, and choose a configuration that fits (--budget)");
  add_train_flags(cmd, *flags);
  cmd->add_option("--world-size,-n", pf->world_size, "ranks the job runs on")->default_str("1");
  cmd->add_option("--budget", pf->budget, "memory per rank to fit (8GiB, 500MB); chooses a configuration");
  cmd->add_option("--device", pf->device,
                  "plan for a GPU by name (h100, h200, a100-80gb, ...): its memory is the budget");
  cmd->add_option("--overhead", pf->overhead,
                  "memory per rank beside the tensors (default: measured here on CPU, not counted for a GPU)");
  cmd->add_option("--headroom", pf->headroom,
                  "percent added to the tensors' peak for what the allocator keeps beyond them (default on CPU: 35 "
                  "in fp32, 85 in bf16, the most measured here; 10 for a GPU)")
      ->check(CLI::Range(0.0, 1000.0));
  cmd->add_flag("--selective-ac", pf->selective_ac,
                "plan torchtitan's selective (op-level) activation checkpointing instead of the job's");
  cmd->add_flag("--json", pf->json, "print the prediction as JSON");
  cmd->callback([flags, pf, &exit_code] { exit_code = run_plan(*flags, *pf); });
}

}  // namespace fsdp::cli
