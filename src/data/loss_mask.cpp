#include "fsdp/data/loss_mask.h"

#include <cstring>

#include "fsdp/common/error.h"
#include "fsdp/io/atomic_file.h"
#include "fsdp/io/input_file.h"

namespace fsdp::data {
namespace {
constexpr size_t kHeaderBytes = 256 * 4;
}  // namespace

std::string loss_mask_path(const std::string& token_file) {
  const bool bin = token_file.size() > 4 && token_file.compare(token_file.size() - 4, 4, ".bin") == 0;
  return (bin ? token_file.substr(0, token_file.size() - 4) : token_file) + ".mask";
}

void write_loss_mask_file(const std::string& path, const std::vector<uint8_t>& mask) {
  std::string bytes(kHeaderBytes, '\0');
  const int32_t header[3] = {kLossMaskMagic, 1, static_cast<int32_t>(mask.size())};
  std::memcpy(bytes.data(), header, sizeof(header));
  bytes.append(reinterpret_cast<const char*>(mask.data()), mask.size());
  io::write_file_atomically(path, bytes);
}

std::vector<uint8_t> read_loss_mask_file(const std::string& path, int64_t expected_tokens) {
  const std::string bytes = io::read_file(path, "loss mask");
  FSDP_CHECK(bytes.size() >= kHeaderBytes, "'", path, "' is ", bytes.size(),
             " bytes, shorter than the 1024-byte header of a loss mask");
  int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  FSDP_CHECK(header[0] == kLossMaskMagic && header[1] == 1, "'", path, "' has magic ", header[0], " and version ",
             header[1], ", expected ", kLossMaskMagic, " and 1 (a loss mask `fsdp data prepare` writes)");
  FSDP_CHECK(header[2] == expected_tokens && static_cast<int64_t>(bytes.size() - kHeaderBytes) == expected_tokens,
             "'", path, "' masks ", header[2], " tokens in ", bytes.size() - kHeaderBytes,
             " bytes, but its token file holds ", expected_tokens,
             ": the two come from different prepares; prepare the data again");
  return {bytes.begin() + kHeaderBytes, bytes.end()};
}

}  // namespace fsdp::data
