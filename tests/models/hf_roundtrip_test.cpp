// Export to Hugging Face layout and import back: bit-exact; and the import's
// errors when the weights do not fit config.json.

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"
#include "fsdp/io/safetensors.h"
#include "fsdp/models/gpt2/model.h"
#include "fsdp/models/hf/weights.h"
#include "fsdp/models/registry.h"

namespace fsdp::models::hf_roundtrip_test {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  const auto dir = fs::temp_directory_path() / ("fsdp-hf-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(dir);
  return dir.string();
}

std::vector<std::pair<std::string, torch::Tensor>> params_of(torch::nn::Module& m) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : m.named_parameters()) out.emplace_back(item.key(), item.value().detach());
  return out;
}

class RoundTrip : public ::testing::TestWithParam<std::string> {};

TEST_P(RoundTrip, ExportThenImportIsBitExact) {
  torch::manual_seed(3);
  auto model = build_preset(GetParam());
  const auto dir = temp_dir(GetParam());
  save_hf_pretrained(*model, params_of(*model), dir);
  auto loaded = load_hf_pretrained(dir);
  const auto a = params_of(*model), b = params_of(*loaded);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(a[i].second.equal(b[i].second)) << a[i].first;
  }
  auto tokens = torch::randint(0, model->vocab_size(), {2, 8}, torch::kLong);
  EXPECT_TRUE(model->forward(tokens).equal(loaded->forward(tokens)));
}

INSTANTIATE_TEST_SUITE_P(Families, RoundTrip, ::testing::Values("gpt2-tiny", "llama-tiny"),
                         [](const auto& info) { return info.param == "gpt2-tiny" ? "gpt2" : "llama"; });

TEST(HfImport, ReadsDropoutAndArchitectureFromConfig) {
  torch::manual_seed(3);
  auto model = build_preset("gpt2-tiny");
  const auto dir = temp_dir("pdrop");
  save_hf_pretrained(*model, params_of(*model), dir);
  auto config = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  config["resid_pdrop"] = 0.25;
  std::ofstream(dir + "/config.json") << config.dump();
  auto loaded = load_hf_pretrained(dir);
  auto& gpt2 = static_cast<GPT2LMHeadModelImpl&>(*loaded);
  EXPECT_DOUBLE_EQ(gpt2.config.resid_pdrop, 0.25);
  EXPECT_EQ(gpt2.config.n_embd, 32);
}

TEST(HfImport, WeightsThatDoNotFitTheConfigAreNamed) {
  torch::manual_seed(3);
  auto model = build_preset("gpt2-tiny");
  const auto dir = temp_dir("mismatch");
  save_hf_pretrained(*model, params_of(*model), dir);
  auto config = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  config["n_embd"] = 64;
  std::ofstream(dir + "/config.json") << config.dump();
  try {
    load_hf_pretrained(dir);
    FAIL();
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("has shape [512, 32]"), std::string::npos) << what;
    EXPECT_NE(what.find("implies [512, 64]"), std::string::npos) << what;
  }
  config["n_embd"] = 32;
  config["n_layer"] = 3;
  std::ofstream(dir + "/config.json") << config.dump();
  try {
    load_hf_pretrained(dir);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no tensor 'transformer.h.2.ln_1.weight'"), std::string::npos) << e.what();
  }
}

TEST(HfImport, AcceptsGpt2CheckpointsWithoutTheTransformerPrefix) {
  // The original gpt2 weights were saved from GPT2Model: "h.0.attn..." keys
  // and the causal-mask buffers "h.0.attn.bias".
  torch::manual_seed(3);
  auto model = build_preset("gpt2-tiny");
  const auto dir = temp_dir("unprefixed");
  save_hf_pretrained(*model, params_of(*model), dir);
  std::vector<std::pair<std::string, torch::Tensor>> unprefixed;
  for (const auto& [name, t] : params_of(*model)) unprefixed.emplace_back(name.substr(12), t);
  unprefixed.emplace_back("h.0.attn.bias", torch::ones({1, 1, 64, 64}));
  io::write_safetensors(dir + "/model.safetensors", unprefixed);
  auto loaded = load_hf_pretrained(dir);
  EXPECT_TRUE(loaded->output_weight().equal(model->output_weight()));
}

TEST(HfImport, NotADirectory) {
  EXPECT_THROW(load_hf_pretrained("/nonexistent/model"), Error);
}

}  // namespace
}  // namespace fsdp::models::hf_roundtrip_test
