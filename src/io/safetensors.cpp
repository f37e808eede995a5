#include "fsdp/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"
#include "fsdp/io/atomic_file.h"

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

}  // namespace

const char* safetensors_dtype_name(at::ScalarType dtype) {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d.name;
  }
  throw Error(std::string("safetensors cannot store dtype ") + c10::toString(dtype));
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FSDP_CHECK(fd_ >= 0, "cannot open '", path, "': ", std::strerror(errno));
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
  FSDP_CHECK(header_len <= kMaxHeaderBytes && 8 + header_len <= size_, "'", path, "': header length ", header_len,
             " does not fit in the file of ", size_, " bytes (truncated or not safetensors)");
  data_start_ = 8 + static_cast<size_t>(header_len);
  const uint64_t data_size = size_ - data_start_;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(reinterpret_cast<const char*>(bytes + 8),
                                   reinterpret_cast<const char*>(bytes + 8 + header_len));
  } catch (const std::exception& e) {
    throw Error("'" + path + "': the header is not valid JSON (" + e.what() + ")");
  }
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
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      FSDP_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0), where,
                 ": shape holds a non-integer or negative dimension");
      const auto dim = d.get<uint64_t>();
      FSDP_CHECK(dim == 0 || numel <= data_size / dim + 1, where, ": shape is absurdly large for a ", size_,
                 "-byte file");
      numel *= dim;
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    for (const auto& o : v["data_offsets"]) {
      FSDP_CHECK(o.is_number_unsigned() || (o.is_number_integer() && o.get<int64_t>() >= 0), where,
                 ": data_offsets must be non-negative integers");
    }
    e.begin = v["data_offsets"][0].get<uint64_t>();
    e.end = v["data_offsets"][1].get<uint64_t>();
    FSDP_CHECK(e.begin <= e.end && e.end <= data_size, where, ": data_offsets [", e.begin, ", ", e.end,
               ") fall outside the ", data_size, "-byte data section (truncated file or corrupt header)");
    const uint64_t expected = numel * c10::elementSize(e.dtype);
    FSDP_CHECK(e.end - e.begin == expected, where, ": holds ", e.end - e.begin, " bytes but shape and dtype need ",
               expected);
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

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  const auto* e = find(name);
  FSDP_CHECK(e != nullptr, "'", path_, "' has no tensor '", name, "'");
  return *e;
}

at::Tensor SafetensorsFile::view(const std::string& name) const {
  const auto& e = entry(name);
  auto* data = static_cast<char*>(map_) + data_start_ + e.begin;
  // The mapping is read-only; callers copy before writing.
  return at::from_blob(data, e.shape, at::TensorOptions().dtype(e.dtype));
}

at::Tensor SafetensorsFile::read_range(const std::string& name, int64_t begin, int64_t count) const {
  const auto& e = entry(name);
  int64_t numel = 1;
  for (auto d : e.shape) numel *= d;
  FSDP_CHECK(begin >= 0 && count >= 0 && begin + count <= numel, "'", path_, "', tensor '", name, "': range [",
             begin, ", ", begin + count, ") is outside its ", numel, " elements");
  auto* data = static_cast<char*>(map_) + data_start_ + e.begin + begin * static_cast<int64_t>(c10::elementSize(e.dtype));
  return at::from_blob(data, {count}, at::TensorOptions().dtype(e.dtype)).clone();
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> contiguous;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    FSDP_CHECK(name != "__metadata__" && !header.contains(name), "write_safetensors: duplicate tensor name '", name, "'");
    contiguous.push_back(t.detach().cpu().contiguous());
    const uint64_t nbytes = contiguous.back().nbytes();
    header[name] = {{"dtype", safetensors_dtype_name(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // align the data section to 8 bytes
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xff);
  AtomicFile file(path);
  file.write(len, 8);
  file.write(text);
  for (const auto& t : contiguous) file.write(t.data_ptr(), t.nbytes());
  file.commit();
}

}  // namespace fsdp::io
