#include "fsdp/io/safetensors.h"
#include "fsdp/io/streamed_read.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include "fsdp/common/error.h"
#include "fsdp/io/atomic_file.h"
#include "fsdp/io/input_file.h"

namespace fsdp::io {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the format's own limit

struct DtypeName {
  const char* name;
  at::ScalarType dtype;
};
constexpr DtypeName kDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16}, {"I64", at::kLong},
    {"I32", at::kInt},    {"I16", at::kShort}, {"I8", at::kChar},   {"U8", at::kByte},       {"BOOL", at::kBool},
};

at::ScalarType parse_dtype(const std::string& name, const std::string& where) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return d.dtype;
  }
  throw Error(where + ": unknown dtype '" + name + "' (expected F64, F32, F16, BF16, I64, I32, I16, I8, U8 or BOOL)");
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

}  // namespace

std::optional<uint64_t> tensor_bytes(const std::vector<int64_t>& shape, at::ScalarType dtype) {
  uint64_t bytes = c10::elementSize(dtype);
  for (const int64_t d : shape) {
    if (d == 0) return 0;  // empty whatever the other dimensions say
  }
  for (const int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) return std::nullopt;
  }
  return bytes;
}

at::ScalarType safetensors_dtype(const std::string& name) { return parse_dtype(name, "safetensors"); }

const char* safetensors_dtype_name(at::ScalarType dtype) {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d.name;
  }
  throw Error(std::string("safetensors cannot store dtype ") + c10::toString(dtype));
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  fd_ = open_regular_file(path, "safetensors file");
  struct stat st {};
  FSDP_CHECK(::fstat(fd_, &st) == 0, "cannot stat '", path, "': ", std::strerror(errno));
  size_ = static_cast<size_t>(st.st_size);
  FSDP_CHECK(size_ >= 8, "'", path, "' is not a safetensors file: ", size_, " bytes, shorter than the 8-byte header length");
  if (size_ > 0) {
    map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
    FSDP_CHECK(map_ != MAP_FAILED, "cannot map '", path, "': ", std::strerror(errno));
  }
  const auto* bytes = static_cast<const unsigned char*>(map_);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  FSDP_CHECK(header_len <= kMaxHeaderBytes, "'", path, "': header length ", header_len, " is past the format's limit of ",
             kMaxHeaderBytes, " bytes (corrupt or not safetensors)");
  FSDP_CHECK(8 + header_len <= size_, "'", path, "': header length ", header_len, " does not fit in the file of ",
             size_, " bytes (truncated or not safetensors)");
  data_start_ = 8 + static_cast<size_t>(header_len);
  const uint64_t data_size = size_ - data_start_;

  const nlohmann::json header = parse_json(
      std::string(reinterpret_cast<const char*>(bytes + 8), static_cast<size_t>(header_len)),
      "'" + path + "': the header");
  FSDP_CHECK(header.is_object(), "'", path, "': the header is not a JSON object");
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string where = "'" + path + "', tensor '" + it.key() + "'";
    if (it.key() == "__metadata__") {
      FSDP_CHECK(it->is_object(), "'", path, "': __metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        FSDP_CHECK(m->is_string(), "'", path, "': metadata '", m.key(), "' is not a string");
        metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const auto& v = *it;
    FSDP_CHECK(v.is_object() && v.contains("dtype") && v.contains("shape") && v.contains("data_offsets") &&
                   v["dtype"].is_string() && v["shape"].is_array() && v["data_offsets"].is_array() &&
                   v["data_offsets"].size() == 2,
               where, ": expected {dtype, shape, data_offsets: [begin, end]}");
    SafetensorsEntry e;
    e.name = it.key();
    e.dtype = parse_dtype(v["dtype"].get<std::string>(), where);
    for (const auto& d : v["shape"]) {
      FSDP_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0), where,
                 ": shape holds a non-integer or negative dimension");
      FSDP_CHECK(d.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX), where, ": dimension ", d.get<uint64_t>(),
                 " is larger than a tensor can have");
      e.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    }
    for (const auto& o : v["data_offsets"]) {
      FSDP_CHECK(o.is_number_unsigned() || (o.is_number_integer() && o.get<int64_t>() >= 0), where,
                 ": data_offsets must be non-negative integers");
    }
    e.begin = v["data_offsets"][0].get<uint64_t>();
    e.end = v["data_offsets"][1].get<uint64_t>();
    FSDP_CHECK(e.begin <= e.end && e.end <= data_size, where, ": data_offsets [", e.begin, ", ", e.end,
               ") fall outside the ", data_size, "-byte data section (truncated file or corrupt header)");
    // The extent the shape claims, without wrapping: a product that overflows
    // would otherwise pass the size check as a small number and let a view
    // reach past the mapping.
    const auto extent = tensor_bytes(e.shape, e.dtype);
    FSDP_CHECK(extent.has_value(), where, ": shape ", shape_text(e.shape), " of ",
               v["dtype"].get<std::string>(), " needs 2^64 bytes or more; the data section holds ",
               data_size);
    FSDP_CHECK(e.end - e.begin == *extent, where, ": holds ", e.end - e.begin, " bytes but shape and dtype need ",
               *extent);
    e.numel = static_cast<int64_t>(*extent / c10::elementSize(e.dtype));
    index_[e.name] = entries_.size();
    entries_.push_back(std::move(e));
  }
  // Tensors must not share bytes.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : entries_) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    FSDP_CHECK(by_offset[i]->begin >= by_offset[i - 1]->end, "'", path, "': tensors '", by_offset[i - 1]->name,
               "' and '", by_offset[i]->name, "' overlap in the data section");
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr && map_ != MAP_FAILED) ::munmap(map_, size_);
  if (fd_ >= 0) ::close(fd_);
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

void SafetensorsFile::check_inside(const SafetensorsEntry& e) const {
  // Established by the constructor; checked again where bytes are touched,
  // because an entry is a plain struct and the mapping is the one fact.
  const uint64_t data_size = size_ - data_start_;
  FSDP_CHECK(e.begin <= e.end && e.end <= data_size &&
                 static_cast<uint64_t>(e.numel) * c10::elementSize(e.dtype) == e.end - e.begin,
             "'", path_, "', tensor '", e.name, "': its extent [", e.begin, ", ", e.end, ") is not inside the ",
             data_size, "-byte data section");
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  const auto* e = find(name);
  FSDP_CHECK(e != nullptr, "'", path_, "' has no tensor '", name, "'");
  return *e;
}

at::Tensor SafetensorsFile::view(const std::string& name) const {
  const auto& e = entry(name);
  check_inside(e);
  auto* data = static_cast<char*>(map_) + data_start_ + e.begin;
  // The mapping is read-only; callers copy before writing.
  return at::from_blob(data, e.shape, at::TensorOptions().dtype(e.dtype));
}

at::Tensor SafetensorsFile::read_range(const std::string& name, int64_t begin, int64_t count) const {
  const auto& e = entry(name);
  check_inside(e);
  const int64_t numel = e.numel;
  FSDP_CHECK(begin >= 0 && count >= 0 && count <= numel && begin <= numel - count, "'", path_, "', tensor '", name,
             "': range [", begin, ", +", count, ") is outside its ", numel, " elements");
  auto* data = static_cast<char*>(map_) + data_start_ + e.begin + begin * static_cast<int64_t>(c10::elementSize(e.dtype));
  return at::from_blob(data, {count}, at::TensorOptions().dtype(e.dtype));
}

void SafetensorsFile::read_range_into(const std::string& name, int64_t begin, const at::Tensor& out) const {
  const at::Tensor source = read_range(name, begin, out.numel());  // checks the range
  if (!out.is_contiguous() || out.scalar_type() != source.scalar_type() || !out.device().is_cpu()) {
    out.view({-1}).copy_(source);
    return;
  }
  auto* to = static_cast<char*>(out.data_ptr());
  const auto bytes = static_cast<size_t>(out.nbytes());
  auto at = static_cast<off_t>(static_cast<const char*>(source.data_ptr()) - static_cast<const char*>(map_));
  for (size_t done = 0; done < bytes;) {
    const ssize_t n = ::pread(fd_, to + done, bytes - done, at + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    FSDP_CHECK(n > 0, "cannot read '", path_, "', tensor '", name, "': ",
               n == 0 ? std::string("the file ended early") : std::string(std::strerror(errno)));
    done += static_cast<size_t>(n);
  }
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, const std::vector<Spec>& specs,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), specs_(specs) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& spec : specs_) {
    FSDP_CHECK(spec.name != "__metadata__" && !header.contains(spec.name), "safetensors: duplicate tensor name '",
               spec.name, "' in '", path, "'");
    uint64_t numel = 1;
    for (auto d : spec.shape) numel *= static_cast<uint64_t>(d);
    const uint64_t nbytes = numel * c10::elementSize(spec.dtype);
    header[spec.name] = {{"dtype", safetensors_dtype_name(spec.dtype)},
                         {"shape", spec.shape},
                         {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // align the data section to 8 bytes
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xff);
  file_ = std::make_unique<AtomicFile>(path, AtomicFile::Mode::kStreamed);
  put(len, 8);
  put(text.data(), text.size());
}

SafetensorsWriter::~SafetensorsWriter() = default;

void SafetensorsWriter::put(const void* data, size_t size) {
  file_->write(data, size);
  crc_ = static_cast<uint32_t>(::crc32(crc_, static_cast<const Bytef*>(data), static_cast<uInt>(size)));
  bytes_ += size;
}

void SafetensorsWriter::write(const at::Tensor& tensor) {
  FSDP_CHECK(next_ < specs_.size(), "safetensors: more tensors than declared for '", path_, "'");
  const auto& spec = specs_[next_++];
  FSDP_CHECK(tensor.scalar_type() == spec.dtype && tensor.sizes().vec() == spec.shape, "safetensors: tensor '",
             spec.name, "' does not match its declared dtype and shape");
  const at::Tensor t = tensor.detach().cpu().contiguous();
  // Large tensors go out in pieces so the CRC's 32-bit length never overflows.
  const auto* p = static_cast<const char*>(t.data_ptr());
  size_t left = t.nbytes();
  while (left > 0) {
    const size_t n = std::min<size_t>(left, 1u << 30);
    put(p, n);
    p += n;
    left -= n;
  }
}

void SafetensorsWriter::commit() {
  FSDP_CHECK(next_ == specs_.size(), "safetensors: ", specs_.size() - next_, " declared tensors were not written to '",
             path_, "'");
  file_->commit();
}

uint32_t file_crc32(const std::string& path) { return read_streamed(path, {}); }

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsWriter::Spec> specs;
  for (const auto& [name, t] : tensors) specs.push_back({name, t.scalar_type(), t.sizes().vec()});
  SafetensorsWriter writer(path, specs, metadata);
  for (const auto& [name, t] : tensors) writer.write(t);
  writer.commit();
}

}  // namespace fsdp::io
