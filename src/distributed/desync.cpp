#include "fsdp/distributed/desync.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "fsdp/common/error.h"
#include "fsdp/common/error_text.h"
#include "fsdp/distributed/collectives.h"
#include "fsdp/distributed/flight_recorder.h"

namespace fsdp::dist {
namespace {

std::shared_ptr<ProcessGroup>& check_group() {
  static std::shared_ptr<ProcessGroup> group;
  return group;
}

// An all-gather of raw bytes that is not itself recorded or checked.
// Returns one row per rank.
at::Tensor gather_bytes(ProcessGroup& group, const at::Tensor& mine, const std::string& purpose) {
  const int w = group.size();
  // NCCL moves device memory only: the bytes travel through the current GPU.
  const auto options = at::TensorOptions(at::kByte).device(group.backend() == Backend::kNccl ? at::kCUDA : at::kCPU);
  at::Tensor out = at::empty({w, mine.numel()}, options);
  std::vector<at::Tensor> rows;
  for (int r = 0; r < w; ++r) rows.push_back(out[r]);
  std::vector<std::vector<at::Tensor>> outputs{rows};
  std::vector<at::Tensor> inputs{mine.to(options.device())};
  try {
    group.impl().allgather(outputs, inputs)->wait(group.timeout());
  } catch (const std::exception& e) {
    throw Error(purpose + " on " + group.describe() + " failed: " + error_text(e) +
                " (a peer died, or never reached this point; peers: " + group.describe_peers() + ")");
  }
  return out.cpu();
}

at::Tensor entry_bytes(const FlightEntry& e) {
  at::Tensor t = at::empty({static_cast<int64_t>(sizeof(FlightEntry))}, at::kByte);
  std::memcpy(t.data_ptr(), &e, sizeof(FlightEntry));
  return t;
}

FlightEntry entry_at(const at::Tensor& row, int64_t index) {
  FlightEntry e;
  std::memcpy(&e, row.data_ptr<uint8_t>() + index * static_cast<int64_t>(sizeof(FlightEntry)), sizeof(FlightEntry));
  e.op[sizeof(e.op) - 1] = e.group[sizeof(e.group) - 1] = e.dtype[sizeof(e.dtype) - 1] = '\0';
  e.role[sizeof(e.role) - 1] = e.unit[sizeof(e.unit) - 1] = '\0';
  return e;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? "," : "") + std::to_string(ranks[i]);
  return text;
}

// "rank 0 issues X; ranks 1,2 issue Y": the distinct calls at one position.
std::string who_issues_what(const std::vector<std::optional<FlightEntry>>& calls) {
  std::vector<std::pair<std::optional<FlightEntry>, std::vector<int>>> distinct;
  for (int r = 0; r < static_cast<int>(calls.size()); ++r) {
    auto same = std::find_if(distinct.begin(), distinct.end(), [&](const auto& d) {
      return d.first.has_value() == calls[r].has_value() && (!d.first || d.first->same_call(*calls[r]));
    });
    if (same == distinct.end()) {
      distinct.push_back({calls[r], {r}});
    } else {
      same->second.push_back(r);
    }
  }
  std::string text;
  for (const auto& [call, ranks] : distinct) {
    if (!text.empty()) text += "; ";
    text += rank_list(ranks) + (call ? ": " + call->describe() : ": none (issued fewer collectives)");
  }
  return text;
}

constexpr int64_t kReportEntries = 64;

[[noreturn]] void report_desync(ProcessGroup& world, const std::string& where) {
  // Every rank is here (they all saw the mismatch): exchange the recent
  // records, newest last, padded to the same size.
  const auto mine = FlightRecorder::instance().entries();
  const int64_t n = std::min<int64_t>(kReportEntries, static_cast<int64_t>(mine.size()));
  at::Tensor buffer = at::zeros({kReportEntries * static_cast<int64_t>(sizeof(FlightEntry))}, at::kByte);
  std::memcpy(buffer.data_ptr(), mine.data() + (mine.size() - static_cast<size_t>(n)),
              static_cast<size_t>(n) * sizeof(FlightEntry));
  const at::Tensor rows = gather_bytes(world, buffer, "reporting a desync");
  const int w = world.size();
  std::vector<std::map<int64_t, FlightEntry>> by_seq(static_cast<size_t>(w));
  int64_t first_common = 0, last_any = 0;
  for (int r = 0; r < w; ++r) {
    int64_t lowest = INT64_MAX;
    for (int64_t i = 0; i < kReportEntries; ++i) {
      const FlightEntry e = entry_at(rows[r], i);
      if (e.seq <= 0) continue;
      by_seq[static_cast<size_t>(r)][e.seq] = e;
      lowest = std::min(lowest, e.seq);
      last_any = std::max(last_any, e.seq);
    }
    first_common = std::max(first_common, lowest == INT64_MAX ? 1 : lowest);
  }
  for (int64_t seq = first_common; seq <= last_any; ++seq) {
    std::vector<std::optional<FlightEntry>> calls;
    for (int r = 0; r < w; ++r) {
      const auto& m = by_seq[static_cast<size_t>(r)];
      const auto it = m.find(seq);
      calls.push_back(it == m.end() ? std::nullopt : std::optional<FlightEntry>(it->second));
    }
    const bool agree = std::all_of(calls.begin(), calls.end(), [&](const auto& c) {
      return c.has_value() == calls[0].has_value() && (!c || c->same_call(*calls[0]));
    });
    if (!agree) {
      throw Error("collectives out of step between ranks (found " + where + "): at collective #" +
                  std::to_string(seq) + ", " + who_issues_what(calls) +
                  ". Every rank must issue the same collectives in the same order; a rank that skips or adds one "
                  "(a data-dependent branch, a unit used on some ranks only) causes this");
    }
  }
  throw Error("collectives out of step between ranks (found " + where + "): their histories differ before the last " +
              std::to_string(kReportEntries) + " collectives; run with FSDP_DEBUG=detail to stop at the first one");
}

}  // namespace

DebugLevel debug_level() {
  static const DebugLevel level = [] {
    const char* v = std::getenv("FSDP_DEBUG");
    const std::string s = v != nullptr ? v : "";
    if (s == "detail" || s == "DETAIL") return DebugLevel::kDetail;
    if (s == "off" || s == "OFF" || s == "0") return DebugLevel::kOff;
    return DebugLevel::kInfo;
  }();
  return level;
}

void set_desync_check_group(std::shared_ptr<ProcessGroup> group) { check_group() = std::move(group); }

void check_same_collective_everywhere(int64_t seq) {
  static std::mutex mutex;  // one check at a time: collectives may be issued from autograd's thread
  std::lock_guard<std::mutex> lock(mutex);
  const auto& group = check_group();
  if (!group || group->size() == 1) return;
  const FlightEntry e = FlightRecorder::instance().find(seq).value_or(FlightEntry{});
  const at::Tensor rows =
      gather_bytes(*group, entry_bytes(e), "FSDP_DEBUG=detail check of collective #" + std::to_string(seq));
  std::vector<std::optional<FlightEntry>> calls;
  bool agree = true;
  for (int r = 0; r < group->size(); ++r) {
    calls.push_back(entry_at(rows[r], 0));
    agree = agree && calls.back()->same_call(e);
  }
  if (!agree) {
    throw Error("collectives out of step between ranks (FSDP_DEBUG=detail, before issuing): " + who_issues_what(calls) +
                ". Every rank must issue the same collectives in the same order");
  }
}

bool any_rank_and_check_sync(ProcessGroup& world, bool local_flag, const std::string& where) {
  const bool check = debug_level() != DebugLevel::kOff && world.size() > 1;
  const double fp = check ? static_cast<double>(FlightRecorder::instance().fingerprint()) : 0.0;
  at::Tensor t = at::tensor({local_flag ? 1.0 : 0.0, fp, -fp}, at::kDouble);
  all_reduce(world, t, ReduceOp::kMax).wait();
  const double* v = t.data_ptr<double>();
  if (check && v[1] != -v[2]) report_desync(world, where);
  return v[0] > 0;
}

}  // namespace fsdp::dist
