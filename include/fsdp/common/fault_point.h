#pragma once
// Named fault points: places where a failure test has this process die on
// purpose, as a crash or `kill -9` would, or be stopped, as a launcher or a
// Ctrl-C would. One variable arms them, read once (at the first point
// reached):
//
//   FSDP_FAULT_POINT=NAME[@N][:SIGNAL][,NAME[@N][:SIGNAL]...]
//
// sends the process SIGNAL (KILL, the default, TERM or INT) the N-th time
// (default 1) it reaches point NAME, after one line on stderr saying so;
// THROW in place of a signal throws fsdp::Error there instead (a failure
// the program reports, not a crash).
// Under `fsdp launch --max-restarts`, only in the first attempt
// (FSDP_RESTART_ATTEMPT unset or 0), so the restarted job runs through. A
// name that is not a point below is an error (fsdp::Error naming it), so a
// test cannot arm nothing by a typo.
// Unset, as in every real run, a point costs one check of a flag.

namespace fsdp {

inline constexpr const char* kFaultPointVar = "FSDP_FAULT_POINT";

// The points, each with where it is and what has happened when it is reached.
inline constexpr const char* kFaultPoints[] = {
    // checkpoint::save, on rank 0: every rank's file and metadata.json are
    // written and fsynced into step_N.tmp/, not yet renamed to step_N/;
    // `latest` still names the previous checkpoint.
    "checkpoint.before_publish",
    // Trainer set-up, on rank 0: the run folder (and --ckpt-dir and
    // --export-hf, where given) is created and locked, and nothing is
    // written in it yet.
    "train.start_folders_made",
    // Trainer set-up done, every rank: the run's files (config.yaml, the
    // metrics' first line, the logs) are written; step 1 has not begun.
    "train.run_files_written",
    // An export to Hugging Face's layout (models::write_hf_dir): one more
    // weights file is written into the partial directory beside the
    // target; the target is as it was.
    "export.weights_file_written",
    // The optimizer's step on the host (--cpu-offload, --optimizer-offload),
    // each visit one unit's step under --overlap-host-step, else the whole
    // step: nothing of what it updates is written yet.
    "train.host_step",
};

// Point `name` (one of kFaultPoints) is reached: dies here when armed for
// this visit.
void fault_point(const char* name);

// Reads FSDP_FAULT_POINT now, so a name that is no point is an error at
// start-up (init_runtime), not when the first point is reached.
void check_fault_points();

}  // namespace fsdp
