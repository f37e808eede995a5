#pragma once
// Token ids from an independent encoder, run by Node.js through
// tests/tools/reference_tokenize.mjs: @huggingface/tokenizers on a
// tokenizer.json ("hf"), llama3-tokenizer-js ("llama3-js") or OpenAI's
// encoder ported to JavaScript ("gpt2-js").

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../test_paths.h"

namespace fsdp::testing {

inline const std::string kReferenceTokenizers = std::string(fsdp::testing::kSourceDir) + "/data/reference-tokenizers";

// Why the reference cannot run here, or "" when it can.
inline std::string reference_missing(const std::string& mode, const std::string& dir) {
  namespace fs = std::filesystem;
  if (std::system("node --version > /dev/null 2>&1") != 0) return "needs Node.js";
  const bool have = mode == "gpt2-js" ? fs::exists(dir + "/Encoder.js")
                    : mode == "llama3-js"
                        ? fs::exists(kReferenceTokenizers + "/llama3-tokenizer-js/package.json")
                        : fs::exists(dir + "/tokenizer.json") &&
                              fs::exists(kReferenceTokenizers + "/@huggingface/tokenizers/package.json");
  return have ? "" : "needs " + dir + " and data/reference-tokenizers (scripts/fetch_data.sh)";
}

inline std::vector<std::vector<int32_t>> reference_ids(const std::string& mode, const std::string& dir,
                                                       const std::vector<std::string>& texts) {
  const std::string input =
      (std::filesystem::temp_directory_path() / ("fsdp-reference-" + std::to_string(::getpid()) + ".json")).string();
  std::ofstream(input) << nlohmann::json(texts).dump();
  const std::string cmd = "node " + std::string(fsdp::testing::kSourceDir) + "/tests/tools/reference_tokenize.mjs " + mode +
                          " '" + dir + "' " + input;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  std::string output;
  char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  ::pclose(pipe);
  std::remove(input.c_str());
  std::vector<std::vector<int32_t>> out;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    std::vector<int32_t> ids;
    std::istringstream fields(line);
    std::string id;
    while (std::getline(fields, id, ',')) ids.push_back(std::stoi(id));
    out.push_back(std::move(ids));
  }
  return out;
}

}  // namespace fsdp::testing
