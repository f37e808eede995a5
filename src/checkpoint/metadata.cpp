#include "fsdp/checkpoint/metadata.h"

#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "fsdp/common/error.h"
#include "fsdp/io/input_file.h"

namespace fsdp::checkpoint {
namespace {

using json = nlohmann::json;

// Field checks; each names the file and the field's path in it.
class Checker {
 public:
  explicit Checker(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& expected) const {
    throw Error("'" + path_ + "': " + field + " " + expected + " (a damaged or foreign checkpoint)");
  }

  const json& member(const json& object, const std::string& key, const std::string& field) const {
    if (!object.contains(key)) fail(field + key, "is missing");
    return object[key];
  }

  int64_t integer(const json& v, const std::string& field, int64_t lo, int64_t hi) const {
    if (!v.is_number_integer()) fail(field, "must be an integer");
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) fail(field, "is out of range");
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) {
      fail(field, "is " + std::to_string(x) + ", expected " + std::to_string(lo) + ".." + std::to_string(hi));
    }
    return x;
  }

  void string_if_present(const json& object, const std::string& key, const std::string& field) const {
    if (object.contains(key) && !object[key].is_string()) fail(field + key, "must be a string");
  }

 private:
  std::string path_;
};

constexpr int64_t kMaxElements = int64_t{1} << 50;  // far beyond any model, far below overflow

// "crc32:xxxxxxxx" of `meta` without its checksum.
std::string checksum_of(json meta) {
  meta.erase("checksum");
  const std::string text = meta.dump();
  const auto crc = ::crc32(::crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(text.data()),
                           static_cast<uInt>(text.size()));
  char hex[16];
  std::snprintf(hex, sizeof(hex), "%08lx", static_cast<unsigned long>(crc));
  return std::string("crc32:") + hex;
}

// A file entry: a plain name inside the checkpoint (metadata must not point
// reads elsewhere), its size and CRC-32.
void check_file_entry(const Checker& c, const json& f, const std::string& field) {
  if (!f.is_object()) c.fail(field, "must be an object");
  const json& name = c.member(f, "name", field + ".");
  if (!name.is_string()) c.fail(field + ".name", "must be a string");
  const auto n = name.get<std::string>();
  if (n.empty() || n == "." || n == ".." || n.find('/') != std::string::npos || n.find('\0') != std::string::npos) {
    c.fail(field + ".name", "'" + n + "' must be a file name inside the checkpoint");
  }
  c.integer(c.member(f, "bytes", field + "."), field + ".bytes", 0, INT64_MAX);
  c.integer(c.member(f, "crc32", field + "."), field + ".crc32", 0, UINT32_MAX);
}

// A name that becomes part of a tensor's name in a rank file: printable,
// without '/'.
void check_part_name(const Checker& c, const std::string& name, const std::string& field) {
  for (const unsigned char ch : name) {
    if (ch < 0x20 || ch == 0x7f || ch == '/') c.fail(field, "holds a name with a control character or '/'");
  }
  if (name.empty()) c.fail(field, "holds an empty name");
}

// Returns the shape's element count (0 with a dimension of 0).
int64_t check_shape(const Checker& c, const json& shape, const std::string& field) {
  if (!shape.is_array()) c.fail(field, "must be an array");
  int64_t numel = 1;
  for (const auto& d : shape) {
    numel *= std::max<int64_t>(1, c.integer(d, field + "[]", 0, kMaxElements));
    if (numel > kMaxElements) c.fail(field, "holds more elements than any model");
  }
  for (const auto& d : shape) numel = d.get<int64_t>() == 0 ? 0 : numel;
  return numel;
}

// Version 3's optimizers, buffers and states.
void check_version_3_parts(const Checker& c, const json& meta, const json& params) {
  static const std::set<std::string> kinds = {"sgd", "adam", "adamw", "rmsprop", "adagrad"};
  const json& optimizers = c.member(meta, "optimizers", "");
  if (!optimizers.is_object()) c.fail("optimizers", "must be an object");
  for (const auto& [name, o] : optimizers.items()) {
    const std::string field = "optimizers['" + name + "'].";
    check_part_name(c, name, "optimizers");
    if (!o.is_object()) c.fail(field, "must be an object");
    const json& kind = c.member(o, "kind", field);
    if (!kind.is_string() || kinds.count(kind.get<std::string>()) == 0) {
      c.fail(field + "kind", "must be one of sgd, adam, adamw, rmsprop, adagrad");
    }
    const json& groups = c.member(o, "groups", field);
    if (!groups.is_array()) c.fail(field + "groups", "must be an array");
    for (const auto& g : groups) {
      if (!g.is_object() || !c.member(g, "options", field + "groups[].").is_object()) {
        c.fail(field + "groups[]", "must be an object with an object of options");
      }
      const json& members = c.member(g, "params", field + "groups[].");
      if (!members.is_array()) c.fail(field + "groups[].params", "must be an array");
      for (const auto& m : members) {
        if (!m.is_string() || !params.contains(m.get<std::string>())) {
          c.fail(field + "groups[].params[]", "must name a saved parameter");
        }
      }
    }
    const json& state = c.member(o, "state", field);
    if (!state.is_object()) c.fail(field + "state", "must be an object");
    for (const auto& [fqn, s] : state.items()) {
      const std::string sfield = field + "state['" + fqn + "'].";
      if (!params.contains(fqn)) c.fail(field + "state", "names '" + fqn + "', which is no saved parameter");
      if (!s.is_object()) c.fail(sfield, "must be an object");
      c.integer(c.member(s, "step", sfield), sfield + "step", 0, kMaxCheckpointCount);
      const json& tensors = c.member(s, "tensors", sfield);
      if (!tensors.is_array()) c.fail(sfield + "tensors", "must be an array");
      for (const auto& t : tensors) {
        if (!t.is_string()) c.fail(sfield + "tensors[]", "must be a string");
        check_part_name(c, t.get<std::string>(), sfield + "tensors[]");
      }
    }
  }
  const json& buffers = c.member(meta, "buffers", "");
  if (!buffers.is_object()) c.fail("buffers", "must be an object");
  for (const auto& [name, b] : buffers.items()) {
    const std::string field = "buffers['" + name + "'].";
    if (!b.is_object()) c.fail(field, "must be an object");
    check_shape(c, c.member(b, "shape", field), field + "shape");
    c.string_if_present(b, "dtype", field);
  }
  if (!buffers.empty() && !meta.contains("buffer_file")) c.fail("buffer_file", "is missing, and buffers are listed");
  if (!c.member(meta, "states", "").is_object()) c.fail("states", "must be an object");
}

}  // namespace

std::string sealed_metadata_text(json meta) {
  meta["checksum"] = checksum_of(meta);
  return meta.dump(1) + "\n";
}

json parse_metadata(const std::string& text, const std::string& path) {
  json meta = io::parse_json(text, "'" + path + "'");
  FSDP_CHECK(meta.is_object() && meta.contains("format") && meta["format"] == kMetadataFormat, "'", path,
             "' is not fsdp.cpp checkpoint metadata");
  const Checker c(path);
  const int64_t version = c.integer(c.member(meta, "version", ""), "version", 0, INT32_MAX);
  FSDP_CHECK(version >= 1 && version <= kMetadataVersion, "'", path, "' has version ", version,
             ", this build reads versions 1 to ", kMetadataVersion);
  if (version >= 2) {
    // Before any other field is believed ([Note: sealed metadata]).
    const json& sum = c.member(meta, "checksum", "");
    if (!sum.is_string()) c.fail("checksum", "must be a string");
    const std::string expected = checksum_of(meta);
    FSDP_CHECK(sum.get<std::string>() == expected, "'", path, "': its checksum ", sum.get<std::string>(),
               " does not match its contents (", expected,
               "): the file was edited or damaged after the save; resume from another checkpoint");
  }
  // Counters feed the data position and the schedule: they stay far inside
  // int64 (2^62 tokens is ten thousand times any run's), so that arithmetic
  // on them cannot overflow however the file was made (the seal is no
  // defence against a forger: docs/faults-and-bad-input.md).
  c.integer(c.member(meta, "step", ""), "step", 0, kMaxCheckpointCount);
  const int64_t world = c.integer(c.member(meta, "world_size", ""), "world_size", 1, 1 << 20);
  for (const char* key : {"sharding", "config", "hf_config"}) c.string_if_present(meta, key, "");
  if (meta.contains("mesh")) {
    if (!meta["mesh"].is_array()) c.fail("mesh", "must be an array");
    int64_t ranks = 1;
    for (const auto& d : meta["mesh"]) ranks *= c.integer(d, "mesh[]", 1, 1 << 20);
    if (!meta["mesh"].empty() && ranks != world) {
      c.fail("mesh", "holds " + std::to_string(ranks) + " ranks, but world_size is " + std::to_string(world));
    }
  }

  const json& trainer = c.member(meta, "trainer", "");
  if (!trainer.is_object()) c.fail("trainer", "must be an object");
  if (trainer.contains("tokens_seen")) {
    c.integer(trainer["tokens_seen"], "trainer.tokens_seen", 0, kMaxCheckpointCount);
  }
  if (trainer.contains("loss_scale") && !trainer["loss_scale"].is_number()) c.fail("trainer.loss_scale", "must be a number");
  if (meta.contains("extra") && !meta["extra"].is_object()) c.fail("extra", "must be an object");
  if (meta.contains("frozen_left_out") && !meta["frozen_left_out"].is_boolean()) {
    c.fail("frozen_left_out", "must be true or false");
  }

  const json& params = c.member(meta, "params", "");
  if (!params.is_object()) c.fail("params", "must be an object");
  for (const auto& [name, p] : params.items()) {
    const std::string field = "params['" + name + "'].";
    if (!p.is_object()) c.fail(field.substr(0, field.size() - 1), "must be an object");
    const int64_t numel = check_shape(c, c.member(p, "shape", field), field + "shape");
    c.string_if_present(p, "dtype", field);
    if (version < 3) c.integer(c.member(p, "adam_step", field), field + "adam_step", 0, kMaxCheckpointCount);
    const json& shards = c.member(p, "shards", field);
    if (!shards.is_array()) c.fail(field + "shards", "must be an array");
    for (const auto& s : shards) {
      if (!s.is_object()) c.fail(field + "shards[]", "must be an object");
      c.integer(c.member(s, "rank", field + "shards[]."), field + "shards[].rank", 0, world - 1);
      const int64_t begin = c.integer(c.member(s, "begin", field + "shards[]."), field + "shards[].begin", 0, numel);
      c.integer(c.member(s, "count", field + "shards[]."), field + "shards[].count", 0, numel - begin);
    }
  }

  if (version >= 3) check_version_3_parts(c, meta, params);

  const json& files = c.member(meta, "files", "");
  if (!files.is_array()) c.fail("files", "must be an array");
  for (const auto& f : files) {
    check_file_entry(c, f, "files[]");
    c.integer(c.member(f, "rank", "files[]."), "files[].rank", 0, world - 1);
  }
  if (meta.contains("buffer_file")) check_file_entry(c, meta["buffer_file"], "buffer_file");
  return meta;
}

json read_metadata(const std::string& checkpoint) {
  const std::string path = checkpoint + "/metadata.json";
  FSDP_CHECK(::access(path.c_str(), F_OK) == 0, "checkpoint '", checkpoint,
             "' has no metadata.json (not a checkpoint, or an unfinished save)");
  return parse_metadata(io::read_file(path, "checkpoint metadata"), path);
}

TrainerState trainer_state(const json& meta) {
  TrainerState state;
  state.step = meta["step"].get<int64_t>();
  state.tokens_seen = meta["trainer"].value("tokens_seen", int64_t{0});
  state.loss_scale = meta["trainer"].value("loss_scale", 0.0);
  state.config_yaml = meta.value("config", "");
  state.hf_config = meta.value("hf_config", "");
  state.sharding = meta.value("sharding", "");
  state.mesh = meta.value("mesh", std::vector<int64_t>{});
  state.extra = meta.value("extra", json::object());
  return state;
}

}  // namespace fsdp::checkpoint
