#pragma once
// Ranks agree that they run one job before the first collective that
// depends on it ([Note: ranks agree on the job]).
//
// [Note: ranks agree on the job]
// Every rank is started by its own command line (torchrun, Slurm, mpirun,
// a hand-typed second node), and nothing made those agree: a rank with
// another --seq-len or --lr trained silently; another model, precision or
// vocabulary died inside Gloo with an unreadable EnforceNotMet. At start-up,
// after the run folder and before the model is built, rank 0 broadcasts its
// job's settings (the effective configuration, the build's version and
// LibTorch, the size of each data file and the --init-from config.json's
// checksum); each rank compares them with its own and one all-reduce says
// whether any differs; then every rank learns every rank's differences, so
// each fails with the same one-line message naming the rank, the key, its
// value and rank 0's.

#include <map>
#include <string>
#include <vector>

#include "fsdp/train/config.h"

namespace fsdp::dist {
class ProcessGroup;
}

namespace fsdp::train {

// key -> value: every configuration key (section.key), and "build",
// "data.train file" / "data.val file" (sizes), "model.init_from config.json"
// (a CRC-32) where they apply.
std::map<std::string, std::string> job_settings(const TrainConfig& config);

// "key VALUE (rank 0: VALUE)" for each key whose values differ or that only
// one side has ("(none)" for the side without it).
std::vector<std::string> setting_differences(const std::map<std::string, std::string>& mine,
                                             const std::map<std::string, std::string>& rank0);

// Text for the wire and back.
std::string settings_text(const std::map<std::string, std::string>& settings);
std::map<std::string, std::string> parse_settings_text(const std::string& text);

// The collective check above; throws fsdp::Error on every rank when any
// rank differs from rank 0.
void check_ranks_run_one_job(const TrainConfig& config, dist::ProcessGroup& group, int rank, int world);

}  // namespace fsdp::train
