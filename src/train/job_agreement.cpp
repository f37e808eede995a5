#include "fsdp/train/job_agreement.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>

#include <torch/torch.h>

#include "fsdp/common/error.h"
#include "fsdp/common/runtime.h"
#include "fsdp/distributed/collectives.h"
#include "fsdp/io/input_file.h"

namespace fsdp::train {
namespace {

std::string file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "missing";
  return S_ISREG(st.st_mode) ? std::to_string(st.st_size) + " bytes" : "not a file";
}

std::string crc_of_file(const std::string& path) {
  try {
    const std::string text = io::read_file(path, "file");
    const auto crc = ::crc32(0L, reinterpret_cast<const Bytef*>(text.data()), static_cast<uInt>(text.size()));
    char hex[16];
    std::snprintf(hex, sizeof(hex), "%08lx", static_cast<unsigned long>(crc));
    return std::string("crc32:") + hex;
  } catch (const Error&) {
    return "unreadable";
  }
}

}  // namespace

std::map<std::string, std::string> job_settings(const TrainConfig& config) {
  std::map<std::string, std::string> out;
  // config.yaml's own layout: "section:" lines, then "  key: value" lines.
  std::istringstream yaml(config.to_yaml());
  std::string line, section;
  while (std::getline(yaml, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    if (line[0] != ' ') {
      section = line.substr(0, colon);
      continue;
    }
    const auto start = line.find_first_not_of(' ');
    std::string value = line.substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.erase(0, 1);
    out[section + "." + line.substr(start, colon - start)] = value;
  }
  // version_report()'s first two lines: fsdp.cpp's version and LibTorch's.
  const std::string versions = version_report();
  const auto second_end = versions.find('\n', versions.find('\n') + 1);
  std::string build = versions.substr(0, second_end);
  std::replace(build.begin(), build.end(), '\n', ',');
  out["build"] = build;
  for (const auto& [key, path] : {std::pair{"data.train", config.data.train}, std::pair{"data.val", config.data.val}}) {
    if (!path.empty() && path != "synthetic") out[std::string(key) + " file"] = file_size(path);
  }
  if (!config.model.init_from.empty()) {
    out["model.init_from config.json"] = crc_of_file(config.model.init_from + "/config.json");
  }
  return out;
}

std::vector<std::string> setting_differences(const std::map<std::string, std::string>& mine,
                                             const std::map<std::string, std::string>& rank0) {
  std::vector<std::string> out;
  const auto value = [](const std::map<std::string, std::string>& m, const std::string& key) {
    const auto it = m.find(key);
    return it == m.end() ? std::string("(none)") : it->second;
  };
  std::map<std::string, bool> keys;
  for (const auto& kv : mine) keys[kv.first] = true;
  for (const auto& kv : rank0) keys[kv.first] = true;
  for (const auto& [key, unused] : keys) {
    const auto here = value(mine, key), there = value(rank0, key);
    if (here != there) out.push_back(key + " " + here + " (rank 0: " + there + ")");
  }
  return out;
}

std::string settings_text(const std::map<std::string, std::string>& settings) {
  std::string text;
  for (const auto& [key, value] : settings) text += key + '\t' + value + '\n';
  return text;
}

std::map<std::string, std::string> parse_settings_text(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const auto tab = line.find('\t');
    if (tab != std::string::npos) out[line.substr(0, tab)] = line.substr(tab + 1);
  }
  return out;
}

void check_ranks_run_one_job(const TrainConfig& config, dist::ProcessGroup& group, int rank, int world) {
  if (world == 1) return;
  const auto mine = job_settings(config);
  // Rank 0's settings, to every rank: their length, then their bytes.
  const std::string text = rank == 0 ? settings_text(mine) : std::string();
  auto length = torch::full({1}, static_cast<int64_t>(text.size()), torch::kLong);
  dist::broadcast(group, length, 0).wait();
  auto bytes = torch::zeros({length.item<int64_t>()}, torch::kByte);
  if (rank == 0) std::memcpy(bytes.data_ptr(), text.data(), text.size());
  dist::broadcast(group, bytes, 0).wait();
  const std::string rank0_text(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel()));
  const auto differences = setting_differences(mine, parse_settings_text(rank0_text));
  // Every rank's differences, to every rank, so that whichever rank's error
  // the launcher shows names them all: the longest length, then each
  // rank's text padded to it.
  std::string own;
  for (const auto& d : differences) own += (own.empty() ? "" : ", ") + d;
  auto longest = torch::full({1}, static_cast<int64_t>(own.size()), torch::kLong);
  dist::all_reduce(group, longest, dist::ReduceOp::kMax).wait();
  const int64_t width = longest.item<int64_t>();
  if (width == 0) return;
  auto mine_padded = torch::zeros({width}, torch::kByte);
  std::memcpy(mine_padded.data_ptr(), own.data(), own.size());
  auto all = torch::zeros({world * width}, torch::kByte);
  dist::all_gather_into_tensor(group, all, mine_padded).wait();
  std::string list;
  for (int r = 0; r < world; ++r) {
    const char* text = static_cast<const char*>(all.data_ptr()) + r * width;
    const std::string differs(text, ::strnlen(text, static_cast<size_t>(width)));
    if (!differs.empty()) list += (list.empty() ? "rank " : "; rank ") + std::to_string(r) + " has " + differs;
  }
  throw Error("the ranks were started with different jobs (every rank must run the same command, configuration, "
              "data and build): " + list);
}

}  // namespace fsdp::train
