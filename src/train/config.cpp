#include "fsdp/train/config.h"

#include <cerrno>
#include <cstdlib>
#include <functional>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "fsdp/common/error.h"
#include "fsdp/common/suggest.h"

namespace fsdp::train {
namespace {

enum class Kind { kInt, kDouble, kBool, kString };

struct Field {
  const char* section;
  const char* key;
  Kind kind;
  std::function<void*(TrainConfig&)> slot;
  std::vector<std::string> allowed;  // for enumerated strings
  std::string dotted() const { return std::string(section) + "." + key; }
};

#define FSDP_FIELD(section, key, kind, ...) \
  Field { #section, #key, kind, [](TrainConfig& c) -> void* { return &c.section.key; }, {__VA_ARGS__} }

const std::vector<Field>& schema() {
  static const std::vector<Field> fields = {
      FSDP_FIELD(model, name, Kind::kString),
      FSDP_FIELD(model, init_from, Kind::kString),
      FSDP_FIELD(model, dropout, Kind::kDouble),
      FSDP_FIELD(model, activation_checkpoint, Kind::kBool),
      FSDP_FIELD(model, chunk_loss, Kind::kBool),
      FSDP_FIELD(model, print, Kind::kBool),
      FSDP_FIELD(data, train, Kind::kString),
      FSDP_FIELD(data, val, Kind::kString),
      FSDP_FIELD(data, seq_len, Kind::kInt),
      FSDP_FIELD(data, batch_size, Kind::kInt),
      FSDP_FIELD(data, grad_accum, Kind::kInt),
      FSDP_FIELD(optim, lr, Kind::kDouble),
      FSDP_FIELD(optim, min_lr_ratio, Kind::kDouble),
      FSDP_FIELD(optim, warmup_steps, Kind::kInt),
      FSDP_FIELD(optim, lr_schedule, Kind::kString, "cosine", "linear", "constant"),
      FSDP_FIELD(optim, weight_decay, Kind::kDouble),
      FSDP_FIELD(optim, beta1, Kind::kDouble),
      FSDP_FIELD(optim, beta2, Kind::kDouble),
      FSDP_FIELD(optim, eps, Kind::kDouble),
      FSDP_FIELD(optim, grad_clip, Kind::kDouble),
      FSDP_FIELD(runtime, steps, Kind::kInt),
      FSDP_FIELD(runtime, seed, Kind::kInt),
      FSDP_FIELD(runtime, precision, Kind::kString, "fp32", "bf16", "fp16"),
      FSDP_FIELD(runtime, log_every, Kind::kInt),
      FSDP_FIELD(runtime, eval_every, Kind::kInt),
      FSDP_FIELD(runtime, eval_batches, Kind::kInt),
      FSDP_FIELD(runtime, metrics, Kind::kString),
      FSDP_FIELD(runtime, tokenizer, Kind::kString),
      FSDP_FIELD(runtime, sample_tokens, Kind::kInt),
      FSDP_FIELD(runtime, sample_prompt, Kind::kString),
      FSDP_FIELD(runtime, export_hf, Kind::kString),
      FSDP_FIELD(runtime, keep_denormals, Kind::kBool),
      FSDP_FIELD(runtime, max_bad_steps, Kind::kInt),
      FSDP_FIELD(fsdp, sharding, Kind::kString, "full_shard", "shard_grad_op", "no_shard", "hybrid_shard"),
      FSDP_FIELD(fsdp, fsdp_size, Kind::kInt),
      FSDP_FIELD(fsdp, prefetch_depth, Kind::kInt),
      FSDP_FIELD(fsdp, explicit_prefetch, Kind::kBool),
      FSDP_FIELD(checkpoint, dir, Kind::kString),
      FSDP_FIELD(checkpoint, save_every, Kind::kInt),
      FSDP_FIELD(checkpoint, keep, Kind::kInt),
      FSDP_FIELD(checkpoint, resume, Kind::kBool),
  };
  return fields;
}
#undef FSDP_FIELD

const Field& find_field(const std::string& dotted, const std::string& source) {
  for (const auto& f : schema()) {
    if (f.dotted() == dotted) return f;
  }
  throw Error(source + ": unknown key '" + dotted + "'" + did_you_mean(dotted, TrainConfig::keys()) +
              " (valid keys: " + join_words(TrainConfig::keys()) + ")");
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kInt: return "an integer";
    case Kind::kDouble: return "a number";
    case Kind::kBool: return "true or false";
    case Kind::kString: return "a string";
  }
  return "?";
}

void assign(TrainConfig& config, const Field& f, const std::string& value, const std::string& source) {
  const std::string where = source + ": " + f.dotted() + " is '" + value + "': expected ";
  void* slot = f.slot(config);
  switch (f.kind) {
    case Kind::kInt: {
      errno = 0;
      char* end = nullptr;
      const long long v = std::strtoll(value.c_str(), &end, 10);
      FSDP_CHECK(!value.empty() && *end == '\0' && errno == 0, where, kind_name(f.kind));
      *static_cast<int64_t*>(slot) = v;
      break;
    }
    case Kind::kDouble: {
      errno = 0;
      char* end = nullptr;
      const double v = std::strtod(value.c_str(), &end);
      FSDP_CHECK(!value.empty() && *end == '\0' && errno == 0, where, kind_name(f.kind));
      *static_cast<double*>(slot) = v;
      break;
    }
    case Kind::kBool: {
      if (value == "true" || value == "1" || value == "yes" || value == "on") {
        *static_cast<bool*>(slot) = true;
      } else if (value == "false" || value == "0" || value == "no" || value == "off") {
        *static_cast<bool*>(slot) = false;
      } else {
        throw Error(where + kind_name(f.kind));
      }
      break;
    }
    case Kind::kString: {
      if (!f.allowed.empty()) {
        const bool ok = std::find(f.allowed.begin(), f.allowed.end(), value) != f.allowed.end();
        FSDP_CHECK(ok, where, "one of ", join_words(f.allowed), did_you_mean(value, f.allowed));
      }
      *static_cast<std::string*>(slot) = value;
      break;
    }
  }
}

std::string value_text(TrainConfig& config, const Field& f) {
  void* slot = f.slot(config);
  switch (f.kind) {
    case Kind::kInt: return std::to_string(*static_cast<int64_t*>(slot));
    case Kind::kDouble: {
      std::ostringstream out;
      out << *static_cast<double*>(slot);
      return out.str();
    }
    case Kind::kBool: return *static_cast<bool*>(slot) ? "true" : "false";
    case Kind::kString: return *static_cast<std::string*>(slot);
  }
  return "";
}

}  // namespace

std::vector<std::string> TrainConfig::keys() {
  std::vector<std::string> out;
  for (const auto& f : schema()) out.push_back(f.dotted());
  return out;
}

void TrainConfig::set(const std::string& dotted_key, const std::string& value, const std::string& source) {
  assign(*this, find_field(dotted_key, source), value, source);
}

void TrainConfig::load_yaml(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    throw Error("--config '" + path + "': cannot read the file");
  } catch (const YAML::Exception& e) {
    throw Error("--config '" + path + "' is not valid YAML: " + e.what());
  }
  if (root.IsNull()) return;
  FSDP_CHECK(root.IsMap(), path, ": expected sections model, data, optim, runtime, fsdp, checkpoint at the top level");
  std::set<std::string> sections;
  for (const auto& f : schema()) sections.insert(f.section);
  for (const auto& section : root) {
    const auto name = section.first.as<std::string>();
    FSDP_CHECK(sections.count(name) != 0, path, ": unknown section '", name, "'",
               did_you_mean(name, {sections.begin(), sections.end()}),
               " (sections: ", join_words({sections.begin(), sections.end()}), ")");
    FSDP_CHECK(section.second.IsMap() || section.second.IsNull(), path, ": section '", name,
               "' must be a mapping of keys to values");
    for (const auto& item : section.second) {
      const std::string dotted = name + "." + item.first.as<std::string>();
      const Field& f = find_field(dotted, path);
      FSDP_CHECK(item.second.IsScalar(), path, ": ", dotted, " must be a single value, ", kind_name(f.kind));
      assign(*this, f, item.second.Scalar(), path);
    }
  }
}

void TrainConfig::validate() const {
  const auto positive = [](int64_t v, const char* key) {
    FSDP_CHECK(v >= 1, key, " is ", v, ": expected at least 1");
  };
  positive(data.seq_len, "data.seq_len");
  positive(data.batch_size, "data.batch_size");
  positive(data.grad_accum, "data.grad_accum");
  positive(runtime.steps, "runtime.steps");
  positive(runtime.log_every, "runtime.log_every");
  positive(runtime.eval_batches, "runtime.eval_batches");
  positive(runtime.max_bad_steps, "runtime.max_bad_steps");
  FSDP_CHECK(runtime.eval_every >= 0, "runtime.eval_every is ", runtime.eval_every, ": expected 0 or more");
  FSDP_CHECK(optim.lr > 0, "optim.lr is ", optim.lr, ": expected a positive learning rate");
  FSDP_CHECK(optim.warmup_steps >= 0, "optim.warmup_steps is ", optim.warmup_steps, ": expected 0 or more");
  FSDP_CHECK(optim.min_lr_ratio >= 0 && optim.min_lr_ratio <= 1, "optim.min_lr_ratio is ", optim.min_lr_ratio,
             ": expected 0..1");
  FSDP_CHECK(optim.grad_clip >= 0, "optim.grad_clip is ", optim.grad_clip, ": expected 0 (off) or a positive norm");
  FSDP_CHECK(model.dropout >= 0 && model.dropout < 1, "model.dropout is ", model.dropout, ": expected 0 <= p < 1");
  FSDP_CHECK(fsdp.prefetch_depth >= 0, "fsdp.prefetch_depth is ", fsdp.prefetch_depth, ": expected 0 or more");
  FSDP_CHECK(fsdp.sharding != "hybrid_shard" || fsdp.fsdp_size >= 1,
             "fsdp.sharding is hybrid_shard but fsdp.fsdp_size is ", fsdp.fsdp_size,
             ": set the shard-group size (--fsdp-size)");
  FSDP_CHECK(checkpoint.save_every >= 0, "checkpoint.save_every is ", checkpoint.save_every, ": expected 0 or more");
  FSDP_CHECK(checkpoint.keep >= 1, "checkpoint.keep is ", checkpoint.keep, ": expected at least 1");
  FSDP_CHECK(!checkpoint.resume || !checkpoint.dir.empty(), "checkpoint.resume needs checkpoint.dir (--ckpt-dir)");
  FSDP_CHECK(runtime.sample_tokens >= 0, "runtime.sample_tokens is ", runtime.sample_tokens, ": expected 0 or more");
}

std::string TrainConfig::to_yaml() const {
  TrainConfig copy = *this;
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::string section;
  for (const auto& f : schema()) {
    if (section != f.section) {
      if (!section.empty()) out << YAML::EndMap;
      section = f.section;
      out << YAML::Key << section << YAML::Value << YAML::BeginMap;
    }
    out << YAML::Key << f.key << YAML::Value;
    const std::string text = value_text(copy, f);
    if (f.kind == Kind::kString) {
      out << YAML::DoubleQuoted << text;
    } else {
      out << text;
    }
  }
  out << YAML::EndMap << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace fsdp::train
