#pragma once
// The files of one saved checkpoint, as a load, an inspection or a
// consolidation reads them: each rank's file and the buffers' file, opened
// on first use and checksummed once, and the saved pieces of a tensor
// spread over them.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"
#include "fsdp/io/safetensors.h"
#include "fsdp/io/streamed_read.h"

namespace fsdp::checkpoint::detail {

// RankFiles' key for the file of buffers rank 0 writes beside its own.
constexpr int kBufferFileRank = -1;

// Bytes [at, at + size) of a rank file, to be copied to `to` as the file
// streams past (a load's read of one range straight into its shard).
struct FileCopy {
  uint64_t at = 0;
  uint64_t size = 0;
  char* to = nullptr;
};

// The saved files of one checkpoint, opened on first use, each checksummed
// once: on its own (get), or while a load streams it (stream).
class RankFiles {
 public:
  RankFiles(std::string dir, const nlohmann::json& meta) : dir_(std::move(dir)) {
    for (const auto& f : meta["files"]) info_[f["rank"].get<int>()] = f;
    if (meta.contains("buffer_file")) info_[kBufferFileRank] = meta["buffer_file"];
  }
  // Opened, its size checked, its checksum not yet.
  const io::SafetensorsFile& open(int rank) {
    auto it = open_.find(rank);
    if (it != open_.end()) return *it->second;
    const std::string path = path_of(rank);
    FSDP_CHECK(std::filesystem::exists(path), "checkpoint '", dir_, "': rank file '", path, "' is missing");
    const auto size = static_cast<int64_t>(std::filesystem::file_size(path));
    FSDP_CHECK(size == info_.at(rank)["bytes"].get<int64_t>(), "checkpoint file '", path, "' is ", size,
               " bytes but was written with ", info_.at(rank)["bytes"].get<int64_t>(), " (truncated or replaced)");
    return *open_.emplace(rank, std::make_unique<io::SafetensorsFile>(path)).first->second;
  }
  // Opened and checksummed.
  const io::SafetensorsFile& get(int rank) {
    const auto& file = open(rank);
    if (verified_.count(rank) == 0) check_crc(rank, io::read_streamed(file.path(), {}));
    return file;
  }
  // Reads the file once, serving `copies` (any order) from its blocks as
  // they pass, and checks its checksum at the end: the copied bytes are
  // the file's only if this returns.
  void stream(int rank, std::vector<FileCopy>& copies) {
    const auto& file = open(rank);
    std::sort(copies.begin(), copies.end(), [](const FileCopy& a, const FileCopy& b) { return a.at < b.at; });
    size_t first = 0;  // copies ending before the current block are done
    const uint32_t crc = io::read_streamed(file.path(), [&](uint64_t offset, const char* data, size_t size) {
      const uint64_t end = offset + size;
      while (first < copies.size() && copies[first].at + copies[first].size <= offset) ++first;
      for (size_t i = first; i < copies.size() && copies[i].at < end; ++i) {
        const FileCopy& c = copies[i];
        const uint64_t lo = std::max(c.at, offset), hi = std::min(c.at + c.size, end);
        if (hi > lo) std::memcpy(c.to + (lo - c.at), data + (lo - offset), hi - lo);
      }
    });
    check_crc(rank, crc);
  }

 private:
  std::string path_of(int rank) const {
    const auto info = info_.find(rank);
    FSDP_CHECK(info != info_.end(), "checkpoint '", dir_, "': metadata lists no file for rank ", rank);
    return dir_ + "/" + info->second["name"].get<std::string>();
  }
  void check_crc(int rank, uint32_t crc) {
    const auto expected = info_.at(rank)["crc32"].get<uint32_t>();
    FSDP_CHECK(crc == expected, "checkpoint file '", path_of(rank), "' fails its checksum (CRC-32 ", crc, ", expected ",
               expected, "): the file is damaged");
    verified_.insert(rank);
  }

  std::string dir_;
  std::map<int, nlohmann::json> info_;
  std::map<int, std::unique_ptr<io::SafetensorsFile>> open_;
  std::set<int> verified_;
};

// Calls fn(rank, lo, hi, piece_begin) for each saved piece of `tensor`
// overlapping elements [begin, begin + n); throws unless they cover them.
template <typename Fn>
void for_each_piece(const nlohmann::json& pieces, int64_t begin, int64_t n, const std::string& what, Fn&& fn) {
  int64_t covered = 0;
  for (const auto& piece : pieces) {
    const int64_t pb = piece["begin"].get<int64_t>(), pn = piece["count"].get<int64_t>();
    const int64_t lo = std::max(begin, pb), hi = std::min(begin + n, pb + pn);
    if (hi <= lo) continue;
    fn(piece["rank"].get<int>(), lo, hi, pb);
    covered += hi - lo;
  }
  FSDP_CHECK(covered == n, "checkpoint: ", what, " covers ", covered, " of the ", n, " elements this rank needs");
}

}  // namespace fsdp::checkpoint::detail
