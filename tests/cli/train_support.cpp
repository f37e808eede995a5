#include "train_support.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "fsdp/data/token_file.h"
#include "fsdp/io/safetensors.h"
#include "fsdp/models/hf/weights.h"
#include "fsdp/models/registry.h"

namespace fsdp::testing {

std::string small_corpus(const std::string& dir) {
  const auto path = dir + "/corpus.bin";
  std::vector<int32_t> tokens;
  uint32_t x = 12345;
  for (int i = 0; i < 20000; ++i) {
    x = x * 1103515245u + 12345u;
    tokens.push_back((x >> 16) % 10 == 0 ? static_cast<int32_t>((x >> 8) % 500) : (i % 50) * 7 % 500);
  }
  data::write_token_file(path, tokens);
  return path;
}

std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

std::vector<double> train_losses(const std::vector<nlohmann::json>& metrics) {
  std::vector<double> out;
  for (const auto& m : metrics) {
    if (m.contains("loss") && !m.contains("split")) out.push_back(m["loss"].get<double>());
  }
  return out;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

void expect_same_weights(const std::string& a, const std::string& b) {
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(a)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() != ".safetensors") continue;
    ++files;
    io::SafetensorsFile fa(a + "/" + name), fb(b + "/" + name);
    ASSERT_EQ(fa.entries().size(), fb.entries().size()) << name;
    for (const auto& entry : fa.entries()) {
      EXPECT_TRUE(at::equal(fa.view(entry.name), fb.view(entry.name))) << name << ": " << entry.name;
    }
  }
  EXPECT_GT(files, 0) << "no rank files in " << a;
}

models::CausalLM write_model_dir(const std::string& preset, int64_t vocab, const std::string& tokenizer_dir,
                                 const std::string& out) {
  auto config = models::hf_config(*models::build_preset(preset));
  config["vocab_size"] = vocab;
  config["num_hidden_layers"] = 1;
  auto model = models::build_from_hf_config(config, "test");
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (const auto& p : model->named_parameters()) params.emplace_back(p.key(), p.value().detach());
  models::save_hf_pretrained(*model, params, out);
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::copy_file(tokenizer_dir + "/" + file, out + "/" + file);
  }
  return model;
}

}  // namespace fsdp::testing
