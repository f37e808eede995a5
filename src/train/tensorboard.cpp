#include "fsdp/train/tensorboard.h"

#include <unistd.h>

#include <boost/crc.hpp>
#include <chrono>
#include <filesystem>

#include "fsdp/common/error.h"
#include "proto/tensorboard_event.pb.h"

namespace fsdp::train {
namespace {

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t masked_crc32c(const void* data, size_t size) {
  // Castagnoli polynomial, reflected, as in RFC 3720 (iSCSI) and TensorFlow.
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, size);
  const uint32_t c = crc.checksum();
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::filesystem::create_directories(dir);
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  path_ = (std::filesystem::path(dir) / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(wall_time())) +
                                         "." + host + "." + std::to_string(::getpid())))
              .string();
  out_.open(path_, std::ios::binary | std::ios::trunc);
  FSDP_CHECK(out_.good(), "cannot write the TensorBoard file '", path_, "'");
  tensorboard::Event event;
  event.set_wall_time(wall_time());
  event.set_file_version("brain.Event:2");
  write_record(event.SerializeAsString());
}

TensorBoardWriter::~TensorBoardWriter() = default;

void TensorBoardWriter::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  tensorboard::Event event;
  event.set_wall_time(wall_time());
  event.set_step(step);
  auto* summary = event.mutable_summary();
  for (const auto& [tag, value] : values) {
    auto* v = summary->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  write_record(event.SerializeAsString());
}

void TensorBoardWriter::text(int64_t step, const std::string& tag, const std::string& markdown) {
  constexpr int kDtString = 7;  // TensorFlow's DT_STRING
  tensorboard::Event event;
  event.set_wall_time(wall_time());
  event.set_step(step);
  auto* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  auto* tensor = v->mutable_tensor();
  tensor->set_dtype(kDtString);
  tensor->mutable_tensor_shape();  // a scalar: no dimensions
  tensor->add_string_val(markdown);
  write_record(event.SerializeAsString());
}

void TensorBoardWriter::write_record(const std::string& bytes) {
  const uint64_t length = bytes.size();  // little-endian on every platform we build for
  const uint32_t length_crc = masked_crc32c(&length, sizeof(length));
  const uint32_t data_crc = masked_crc32c(bytes.data(), bytes.size());
  out_.write(reinterpret_cast<const char*>(&length), sizeof(length));
  out_.write(reinterpret_cast<const char*>(&length_crc), sizeof(length_crc));
  out_.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out_.write(reinterpret_cast<const char*>(&data_crc), sizeof(data_crc));
  out_.flush();
  FSDP_CHECK(out_.good(), "cannot write the TensorBoard file '", path_, "' (disk full?)");
}

}  // namespace fsdp::train
