// What a checkpoint holds and whether its files are intact: damage() and
// inspect() (`fsdp ckpt inspect`).
#include "fsdp/checkpoint/checkpoint.h"

#include <sstream>

#include "checkpoint/contents.h"
#include "checkpoint/rank_files.h"

namespace fsdp::checkpoint {

namespace {

using detail::kBufferFileRank;
using detail::RankFiles;
using detail::saved_optimizers;

// Every file of a checkpoint with its RankFiles key: the ranks', then the buffers'.
std::vector<std::pair<int, nlohmann::json>> files_of(const nlohmann::json& meta) {
  std::vector<std::pair<int, nlohmann::json>> out;
  for (const auto& f : meta["files"]) out.emplace_back(f["rank"].get<int>(), f);
  if (meta.contains("buffer_file")) out.emplace_back(kBufferFileRank, meta["buffer_file"]);
  return out;
}

}  // namespace

std::string damage(const std::string& checkpoint) {
  try {
    const nlohmann::json meta = read_metadata(checkpoint);
    RankFiles files(checkpoint, meta);
    for (const auto& [key, f] : files_of(meta)) files.get(key);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::string inspect(const std::string& checkpoint) {
  const nlohmann::json meta = read_metadata(checkpoint);
  std::ostringstream out;
  int64_t elements = 0;
  for (const auto& [name, p] : meta["params"].items()) {
    (void)name;
    int64_t n = 1;
    for (auto d : p["shape"]) n *= d.get<int64_t>();
    elements += n;
  }
  out << "checkpoint " << checkpoint << "\n"
      << "  step " << meta["step"] << ", saved by " << meta["world_size"] << " rank(s), sharding "
      << meta.value("sharding", "?") << ", mesh " << meta.value("mesh", nlohmann::json::array()).dump() << "\n"
      << "  " << meta["params"].size() << " parameters, " << elements << " elements, tokens seen "
      << meta["trainer"].value("tokens_seen", int64_t{0}) << "\n";
  if (!meta.value("buffers", nlohmann::json::object()).empty()) out << "  " << meta["buffers"].size() << " buffers\n";
  for (const auto& [name, o] : saved_optimizers(meta)) {
    out << "  optimizer '" << name << "': " << o.kind << ", state for " << o.state.size() << " parameters\n";
  }
  if (meta.contains("states")) {
    for (const auto& [name, unused] : meta["states"].items()) out << "  state '" << name << "'\n";
  }
  RankFiles files(checkpoint, meta);
  bool ok = true;
  for (const auto& [key, f] : files_of(meta)) {
    std::string status = "ok";
    try {
      files.get(key);
    } catch (const Error& e) {
      status = std::string("BAD: ") + e.what();
      ok = false;
    }
    out << "  " << f["name"].get<std::string>() << "  " << f["bytes"] << " bytes  crc32 " << f["crc32"] << "  "
        << status << "\n";
  }
  out << (ok ? "  checksums: all files intact\n" : "  checksums: DAMAGED files above\n");
  return out.str();
}

}  // namespace fsdp::checkpoint
