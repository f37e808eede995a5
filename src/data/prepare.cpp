#include "fsdp/data/prepare.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"
#include "fsdp/data/gpt2_tokenizer.h"
#include "fsdp/data/token_file.h"

namespace fsdp::data {
namespace {

namespace fs = std::filesystem;

std::string document_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  FSDP_CHECK(in.good(), "cannot read '", path.string(), "'");
  std::stringstream ss;
  ss << in.rdbuf();
  if (path.extension() != ".json") return ss.str();
  try {
    const auto j = nlohmann::json::parse(ss.str());
    FSDP_CHECK(j.is_object() && j.contains("text") && j["text"].is_string(), "'", path.string(),
               "' has no string field \"text\"");
    return j["text"].get<std::string>();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error("'" + path.string() + "' is not valid JSON (" + e.what() + ")");
  }
}

}  // namespace

PrepareStats prepare_corpus(const PrepareOptions& o) {
  FSDP_CHECK(o.val_fraction > 0 && o.val_fraction < 1, "--val-fraction ", o.val_fraction, ": expected 0 < f < 1");
  FSDP_CHECK(fs::exists(o.input), "--input '", o.input, "' does not exist");
  std::vector<fs::path> files;
  if (fs::is_directory(o.input)) {
    for (const auto& e : fs::directory_iterator(o.input)) {
      const auto ext = e.path().extension();
      if (e.is_regular_file() && (ext == ".txt" || ext == ".json")) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(o.input);
  }
  FSDP_CHECK(!files.empty(), "--input '", o.input, "' holds no .txt or .json documents");
  GPT2Tokenizer tokenizer(o.tokenizer_dir + "/encoder.json", o.tokenizer_dir + "/vocab.bpe");

  const auto every = static_cast<size_t>(std::max(2.0, std::round(1.0 / o.val_fraction)));
  std::vector<int32_t> train, val;
  PrepareStats stats;
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string text = document_text(files[i]);
    auto& dest = (files.size() > 1 && i % every == every - 1) ? val : train;
    dest.push_back(GPT2Tokenizer::kEndOfText);
    const auto ids = tokenizer.encode(text);
    dest.insert(dest.end(), ids.begin(), ids.end());
    stats.bytes += static_cast<int64_t>(text.size());
    ++stats.documents;
  }
  if (val.empty()) {
    // One document: hold out its tail instead.
    const auto cut = train.size() - static_cast<size_t>(static_cast<double>(train.size()) * o.val_fraction);
    val.assign(train.begin() + static_cast<std::ptrdiff_t>(cut), train.end());
    train.resize(cut);
  }
  fs::create_directories(o.out_dir);
  write_token_file(o.out_dir + "/train.bin", train);
  write_token_file(o.out_dir + "/val.bin", val);
  stats.train_tokens = static_cast<int64_t>(train.size());
  stats.val_tokens = static_cast<int64_t>(val.size());
  return stats;
}

}  // namespace fsdp::data
