// Every family through the registry: Hugging Face names and shapes,
// parameter counts by formula for every preset (and against published
// figures), import -> export -> import exact in fp32 and in bf16, sharded
// weights with an index, and config.json keys that are refused.

#include <chrono>
#include <filesystem>
#include <fstream>
#include <tuple>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"
#include "fsdp/io/safetensors.h"
#include "fsdp/models/hf/shard_index.h"
#include "fsdp/models/hf/weights.h"
#include "fsdp/models/llama/model.h"
#include "fsdp/models/llama4/config.h"
#include "fsdp/models/qwen3/config.h"
#include "fsdp/models/registry.h"
#include "fsdp/nn/layers.h"

namespace fsdp::models::families_test {
namespace {

namespace fs = std::filesystem;
using Named = std::vector<std::pair<std::string, torch::Tensor>>;

std::string temp_dir(const std::string& name) {
  const auto dir = fs::temp_directory_path() / ("fsdp-families-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(dir);
  return dir.string();
}

Named params_of(torch::nn::Module& m) {
  Named out;
  for (const auto& item : m.named_parameters()) out.emplace_back(item.key(), item.value().detach());
  return out;
}

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(std::ifstream(path)); }
void write_json(const std::string& path, const nlohmann::json& j) { std::ofstream(path) << j.dump(2); }

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The tiny preset of each family with a Hugging Face equivalent.
const std::vector<std::string> kTiny = {"gpt2-tiny",  "llama-tiny",     "llama2-tiny", "mistral-tiny",
                                        "qwen3-tiny", "qwen3-moe-tiny", "llama4-tiny"};

class Family : public ::testing::TestWithParam<std::string> {};

TEST(Registry, EveryPresetsParameterCountByFormulaEqualsTheBuiltModel) {
  // Built deferred: the 30B model's parameters have shapes but no memory.
  for (const auto& f : families()) {
    for (const auto& preset : f.presets) {
      nn::DeferredInit deferred;
      auto model = f.build_preset(preset, 0.0);
      EXPECT_EQ(count_parameters(*model), f.preset_parameter_count(preset)) << preset;
    }
  }
}

TEST(Registry, PublishedParameterCounts) {
  const auto count = [](const std::string& preset) {
    nn::DeferredInit deferred;
    return count_parameters(*build_preset(preset));
  };
  EXPECT_EQ(count("gpt2"), 124439808);
  EXPECT_EQ(count("llama3-8b"), 8030261248LL);     // Meta's Llama 3 8B
  EXPECT_EQ(count("llama3.2-1b"), 1235814400LL);   // Llama 3.2 1B, tied
  EXPECT_EQ(count("mistral-7b"), 7248023552LL);    // Mistral 7B v0.3
  EXPECT_EQ(count("llama3.2-3b"), 3212749824LL);   // Llama 3.2 3B, tied
  // Qwen3 by hand. 0.6B: embedding 151936 * 1024 (tied) + 28 layers of
  // q 1024*2048, k and v 1024*1024, o 2048*1024, MLP 3*1024*3072, norms
  // 2*1024 + 2*128, + final norm 1024.
  const auto q06 = qwen3_preset("qwen3-0.6b");
  EXPECT_EQ(llama_parameter_count(q06), 151936LL * 1024 + 28 * (2 * 2097152 + 2 * 1048576 + 9437184 + 2304) + 1024);
  // 30B-A3B: untied embeddings 2 * 151936 * 2048; 48 layers of q 2048*4096,
  // k and v 2048*512, o 4096*2048, norms 2*2048 + 2*128, router 128*2048 and
  // 128 experts of 3*2048*768 (8 per token active); + final norm.
  const auto q30 = qwen3_preset("qwen3-30b-a3b");
  const int64_t attention = 2 * 8388608 + 2 * 1048576 + 4096 + 256 + 262144, expert = 3 * 2048 * 768;
  EXPECT_EQ(llama_parameter_count(q30), 2 * 151936LL * 2048 + 48 * (attention + 128 * expert) + 2048);
  EXPECT_EQ(llama_active_parameter_count(q30), 2 * 151936LL * 2048 + 48 * (attention + 8 * expert) + 2048);
  // The model cards: Qwen3-0.6B "0.6B (0.44B non-embedding)"; Qwen3-30B-A3B
  // "30.5B in total and 3.3B activated (29.9B non-embedding)".
  EXPECT_NEAR(llama_parameter_count(q06) / 1e9, 0.6, 0.05);
  EXPECT_NEAR((llama_parameter_count(q06) - q06.vocab_size * q06.hidden_size) / 1e9, 0.44, 0.005);
  EXPECT_NEAR(llama_parameter_count(q30) / 1e9, 30.5, 0.05);
  EXPECT_NEAR(llama_active_parameter_count(q30) / 1e9, 3.3, 0.06);
  EXPECT_NEAR((llama_parameter_count(q30) - 2 * q30.vocab_size * q30.hidden_size) / 1e9, 29.9, 0.05);
  EXPECT_EQ(count("qwen3-30b-a3b"), llama_parameter_count(q30));
  // transformers' LlamaForCausalLM with Llama 2's published config.json,
  // counted on the meta device: 6.74B, 13.0B, 69.0B.
  EXPECT_EQ(count("llama2-7b"), 6738415616LL);
  EXPECT_EQ(count("llama2-13b"), 13015864320LL);
  EXPECT_EQ(count("llama2-70b"), 68976648192LL);
  // transformers' Llama4ForCausalLM with the text_config of
  // Llama-4-Scout-17B-16E and Llama-4-Maverick-17B-128E, counted the same
  // way. Meta's "109B total" and "400B total" include the vision tower
  // (0.87B with Scout's vision_config: 108.64B and 401.58B in all); "17B active" is the text model's
  // with one routed expert per token.
  EXPECT_EQ(count("llama4-scout"), 107769861120LL);
  EXPECT_EQ(count("llama4-maverick"), 400711848960LL);
  EXPECT_NEAR(llama4_active_parameter_count(llama4_preset("llama4-scout")) / 1e9, 17.0, 0.25);
  EXPECT_NEAR(llama4_active_parameter_count(llama4_preset("llama4-maverick")) / 1e9, 17.0, 0.25);
}

TEST(Llama4, ConfigKeysItDoesNotImplementAreRefusedByName) {
  const auto good = hf_config(*build_preset("llama4-tiny"));
  EXPECT_EQ(llama4_text_config_from_hf(good, "x").text.moe.sparse_layers(4), (std::vector<int64_t>{1, 3}));
  const auto refused = [&](const char* key, const nlohmann::json& value) {
    auto j = good;
    j[key] = value;
    return error_of([&] { llama4_text_config_from_hf(j, "x"); });
  };
  EXPECT_NE(refused("layer_types", {"chunked_attention", "sliding_attention", "full_attention", "full_attention"})
                .find("\"sliding_attention\", which is not implemented"),
            std::string::npos);
  EXPECT_NE(refused("no_rope_layers", {1, 2, 1, 0}).find("no_rope_layers holds 2"), std::string::npos);
  EXPECT_NE(refused("no_rope_layers", {1, 0}).find("has 2 entries for 4 layers"), std::string::npos);
  EXPECT_NE(refused("moe_layers", {1, 9}).find("moe_layers names layer 9 of 4"), std::string::npos);
  EXPECT_NE(refused("router_jitter_noise", 0.5).find("router_jitter_noise"), std::string::npos);
  EXPECT_NE(refused("attention_bias", true).find("attention_bias"), std::string::npos);
  // The multimodal form: its text_config is read, anything else at the top
  // level is refused.
  nlohmann::json both = {{"model_type", "llama4"}, {"text_config", good}, {"vision_config", {{"hidden_size", 8}}}};
  EXPECT_EQ(llama4_config_from_hf(both, "x").text.hidden_size, 64);
  both["tie_word_embeddings"] = true;
  EXPECT_NE(error_of([&] { llama4_config_from_hf(both, "x"); }).find("tie_word_embeddings"), std::string::npos);
  both.erase("text_config");
  both.erase("tie_word_embeddings");
  EXPECT_NE(error_of([&] { llama4_config_from_hf(both, "x"); }).find("no text_config"), std::string::npos);
}

// text_config of meta-llama/Llama-4-Scout-17B-16E's config.json as Meta
// published it (transformers 4.51), keys and values as written there.
const char* kScoutTextConfig = R"({
  "attention_bias": false, "attention_chunk_size": 8192, "attention_dropout": 0.0, "attn_scale": 0.1,
  "attn_temperature_tuning": 4, "bos_token_id": 200000, "eos_token_id": [200001, 200007, 200008],
  "floor_scale": 8192, "for_llm_compressor": false, "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
  "initializer_range": 0.02, "interleave_moe_layer_step": 1, "intermediate_size": 8192,
  "intermediate_size_mlp": 16384, "max_position_embeddings": 262144, "model_type": "llama4_text",
  "moe_layers": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26,
                 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47],
  "no_rope_layers": [1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0,
                     1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0],
  "num_attention_heads": 40, "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8,
  "num_local_experts": 16, "output_router_logits": false, "pad_token_id": 200018, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0, "torch_dtype": "bfloat16",
  "use_cache": true, "use_qk_norm": true, "vocab_size": 202048})";

TEST(Llama4, MetasPublishedConfigsAreRead) {
  nlohmann::json scout = {{"architectures", {"Llama4ForConditionalGeneration"}},
                          {"boi_token_index", 200080},
                          {"eoi_token_index", 200081},
                          {"image_token_index", 200092},
                          {"model_type", "llama4"},
                          {"text_config", nlohmann::json::parse(kScoutTextConfig)},
                          {"tie_word_embeddings", false},
                          {"transformers_version", "4.51.0"},
                          {"vision_config", {{"hidden_size", 1408}, {"num_hidden_layers", 34}}}};
  const auto c = llama4_config_from_hf(scout, "scout");
  EXPECT_EQ(c.text.hidden_size, 5120);
  EXPECT_EQ(c.text.pad_token_id, 200018) << "text_config's pad_token_id is the padding row";
  EXPECT_TRUE(c.attn_temperature_tuning) << "written as the number 4";
  EXPECT_TRUE(c.is_moe(0) && c.is_moe(47));
  EXPECT_TRUE(c.uses_rope(2) && !c.uses_rope(3));
  EXPECT_TRUE(c.is_chunked(2) && !c.is_chunked(3)) << "RoPE layers attend in chunks by default";
  EXPECT_EQ(c.attention_chunk_size, 8192);
  EXPECT_EQ(c.text.rope_scaling.factor, 8.0);
  // The later revision: rope factor 16 with equal band factors, 10M
  // positions, no_rope_layers left to its default, a hybrid cache.
  auto later = scout;
  auto& t = later["text_config"];
  t["rope_scaling"] = {{"factor", 16.0}, {"high_freq_factor", 1.0}, {"low_freq_factor", 1.0},
                       {"original_max_position_embeddings", 8192}, {"rope_type", "llama3"}};
  t["max_position_embeddings"] = 10485760;
  t["no_rope_layers"] = nlohmann::json::array();
  t["cache_implementation"] = "hybrid";
  const auto l = llama4_config_from_hf(later, "scout");
  EXPECT_EQ(l.no_rope_layers, c.no_rope_layers) << "an empty list is the default, a NoPE layer every 4th";
  EXPECT_EQ(l.text.rope_scaling.high_freq_factor, 1.0);
  // Maverick's (as TensorRT-LLM's tests copy it): experts every other
  // layer, no rope scaling, no q/k norm.
  auto maverick = t;
  maverick.erase("moe_layers");
  maverick.erase("cache_implementation");
  maverick["interleave_moe_layer_step"] = 2;
  maverick["num_local_experts"] = 128;
  maverick["rope_scaling"] = nullptr;
  maverick["use_qk_norm"] = false;
  maverick["_attn_implementation_autoset"] = true;
  const auto m = llama4_text_config_from_hf(maverick, "maverick");
  EXPECT_TRUE(!m.is_moe(0) && m.is_moe(1) && !m.is_moe(46) && m.is_moe(47));
  EXPECT_EQ(m.text.rope_scaling.rope_type, "");
  EXPECT_EQ(llama4_parameter_count(m), llama4_parameter_count(llama4_preset("llama4-maverick")));
}

TEST(Llama4, DefaultsAreTransformersOnes) {
  auto j = hf_config(*build_preset("llama4-tiny"));
  for (const char* key : {"rms_norm_eps", "rope_theta", "head_dim", "attention_chunk_size", "rope_scaling"}) {
    j.erase(key);
  }
  j["moe_layers"] = nlohmann::json::array();  // explicitly none
  const auto c = llama4_text_config_from_hf(j, "x");
  EXPECT_EQ(c.text.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.text.rope_theta, 500000.0);
  EXPECT_EQ(c.text.head_dim, 128);
  EXPECT_EQ(c.attention_chunk_size, 8192);
  EXPECT_FALSE(c.is_moe(1)) << "moe_layers: [] means no MoE layers";
  j["attention_chunk_size"] = nullptr;
  EXPECT_EQ(llama4_text_config_from_hf(j, "x").attention_chunk_size, 0);
  j["layer_types"] = "chunked_attention";
  EXPECT_NE(error_of([&] { llama4_text_config_from_hf(j, "x"); }).find("layer_types is \"chunked_attention\""),
            std::string::npos);
}

TEST(Llama4, HuggingFaceNamesAndShapes) {
  auto model = build_preset("llama4-tiny");
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, t] : params_of(*model)) shapes[name] = t.sizes().vec();
  // Layers 1 and 3 hold 4 experts of width 32, fused, and a shared expert;
  // 0 and 2 a dense SwiGLU of width 128.
  EXPECT_EQ(shapes.at("model.layers.1.feed_forward.experts.gate_up_proj"), (std::vector<int64_t>{4, 64, 64}));
  EXPECT_EQ(shapes.at("model.layers.3.feed_forward.experts.down_proj"), (std::vector<int64_t>{4, 32, 64}));
  EXPECT_EQ(shapes.at("model.layers.1.feed_forward.router.weight"), (std::vector<int64_t>{4, 64}));
  EXPECT_EQ(shapes.at("model.layers.1.feed_forward.shared_expert.gate_proj.weight"), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(shapes.at("model.layers.0.feed_forward.gate_proj.weight"), (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(shapes.count("model.layers.0.feed_forward.router.weight"), 0u);
  EXPECT_EQ(shapes.at("model.layers.2.self_attn.k_proj.weight"), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(shapes.at("lm_head.weight"), (std::vector<int64_t>{512, 64}));
  // Per token: the shared expert and 2 of 4 routed ones, in 2 layers.
  EXPECT_EQ(model->active_parameter_count(), count_parameters(*model) - 2 * (4 - 2) * 3 * 64 * 32);
}

TEST(Registry, ActiveParametersOfTheTinyMoECountTheRoutedExpertsOnly) {
  auto model = build_preset("qwen3-moe-tiny");
  const auto c = qwen3_preset("qwen3-moe-tiny");
  // Layers 0 and 2 are sparse (layer 1 is in mlp_only_layers): each token
  // uses 2 of 8 experts of 3 * 64 * 32 parameters.
  const int64_t expert = 3 * 64 * 32;
  EXPECT_EQ(model->active_parameter_count(), count_parameters(*model) - 2 * (8 - 2) * expert);
  EXPECT_EQ(c.moe.is_sparse(0), true);
  EXPECT_EQ(c.moe.is_sparse(1), false);
}

TEST(Qwen3, HuggingFaceNamesAndShapes) {
  auto model = build_preset("qwen3-tiny");
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, t] : params_of(*model)) shapes[name] = t.sizes().vec();
  // hidden 64, 4 query heads and 2 key/value heads of 32: q_proj is 128 wide.
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.q_proj.weight"), (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.k_proj.weight"), (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.o_proj.weight"), (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.q_norm.weight"), (std::vector<int64_t>{32}));
  EXPECT_EQ(shapes.at("model.layers.1.self_attn.k_norm.weight"), (std::vector<int64_t>{32}));
  EXPECT_EQ(shapes.count("lm_head.weight"), 0u) << "tied: the head is the embedding";
  EXPECT_TRUE(model->output_weight().is_same(dynamic_cast<LlamaForCausalLMImpl&>(*model).model->embed_tokens->weight));
  EXPECT_EQ(shapes.size(), 1u + 2 * 11 + 1) << "embed, norm and 11 tensors per layer";
}

TEST(Qwen3Moe, HuggingFaceNamesAndShapes) {
  auto model = build_preset("qwen3-moe-tiny");
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, t] : params_of(*model)) shapes[name] = t.sizes().vec();
  EXPECT_EQ(shapes.at("model.layers.0.mlp.gate.weight"), (std::vector<int64_t>{8, 64}));
  EXPECT_EQ(shapes.at("model.layers.0.mlp.experts.7.gate_proj.weight"), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(shapes.at("model.layers.2.mlp.experts.0.down_proj.weight"), (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(shapes.at("model.layers.1.mlp.up_proj.weight"), (std::vector<int64_t>{128, 64})) << "a dense layer";
  EXPECT_EQ(shapes.count("model.layers.1.mlp.gate.weight"), 0u);
  EXPECT_EQ(shapes.at("lm_head.weight"), (std::vector<int64_t>{512, 64}));
}

TEST_P(Family, ImportExportImportIsBitExactInFp32) {
  torch::manual_seed(3);
  auto model = build_preset(GetParam());
  const auto dir = temp_dir(GetParam() + "-fp32");
  save_hf_pretrained(*model, params_of(*model), dir);
  auto first = load_hf_pretrained(dir);
  const auto dir2 = temp_dir(GetParam() + "-fp32-again");
  save_hf_pretrained(*first, params_of(*first), dir2);
  auto second = load_hf_pretrained(dir2);
  const auto a = params_of(*model), b = params_of(*second);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(a[i].second.equal(b[i].second)) << a[i].first;
  }
  EXPECT_EQ(read_json(dir + "/config.json"), read_json(dir2 + "/config.json"));
  EXPECT_EQ(read_json(dir + "/config.json")["model_type"], family_of(*model).name);
  auto tokens = torch::randint(0, model->vocab_size(), {2, 8}, torch::kLong);
  EXPECT_TRUE(model->forward(tokens).equal(second->forward(tokens)));
}

TEST_P(Family, Bf16WeightsRoundTripExactlyAndKeepTheirDtype) {
  torch::manual_seed(4);
  auto model = build_preset(GetParam());
  const auto dir = temp_dir(GetParam() + "-bf16");
  HfExportOptions bf16;
  bf16.dtype = "BF16";
  save_hf_pretrained(*model, params_of(*model), dir, bf16);
  EXPECT_EQ(read_json(dir + "/config.json")["torch_dtype"], "bfloat16");
  // Imported into the fp32 master: each value is the bf16 value, exactly.
  auto loaded = load_hf_pretrained(dir);
  EXPECT_EQ(loaded->hf_dtype, "BF16");
  io::SafetensorsFile file(dir + "/model.safetensors");
  for (const auto& [name, value] : params_of(*loaded)) {
    ASSERT_EQ(value.scalar_type(), torch::kFloat);
    const auto keys = family_of(*loaded).hf_keys(name);
    EXPECT_EQ(file.find(keys.front())->dtype, torch::kBFloat16) << name;
    EXPECT_TRUE(value.equal(file.view(keys.front()).to(torch::kFloat))) << name;
  }
  // Exported again with the default dtype (the config's, bf16): the same bytes.
  const auto dir2 = temp_dir(GetParam() + "-bf16-again");
  save_hf_pretrained(*loaded, params_of(*loaded), dir2);
  io::SafetensorsFile again(dir2 + "/model.safetensors");
  ASSERT_EQ(file.entries().size(), again.entries().size());
  for (const auto& e : file.entries()) EXPECT_TRUE(file.view(e.name).equal(again.view(e.name))) << e.name;
  // fp16 too, on request.
  HfExportOptions fp16;
  fp16.dtype = "F16";
  save_hf_pretrained(*loaded, params_of(*loaded), dir2, fp16);
  EXPECT_EQ(read_json(dir2 + "/config.json")["torch_dtype"], "float16");
  EXPECT_EQ(io::SafetensorsFile(dir2 + "/model.safetensors").entries()[0].dtype, torch::kHalf);
}

TEST_P(Family, ShardedWeightsWithAnIndexAreWrittenAndRead) {
  torch::manual_seed(5);
  auto model = build_preset(GetParam());
  const auto params = params_of(*model);
  const auto dir = temp_dir(GetParam() + "-sharded");
  save_hf_pretrained(*model, params, dir);  // one file first: the sharded export must replace it
  HfExportOptions o;
  o.max_shard_bytes = 100'000;
  save_hf_pretrained(*model, params, dir, o);
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors")) << "the earlier single file was left behind";
  const auto index = read_json(dir + "/" + hf::kIndexFile);
  std::set<std::string> files;
  int64_t total = 0;
  for (const auto& [tensor, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  ASSERT_GE(files.size(), 2u);
  for (const auto& f : files) {
    io::SafetensorsFile shard(dir + "/" + f);
    int64_t bytes = 0;
    for (const auto& e : shard.entries()) {
      bytes += static_cast<int64_t>(e.end - e.begin);
      EXPECT_EQ(index["weight_map"][e.name], f) << e.name;
    }
    // save_pretrained's rule: only a single tensor larger than the limit
    // makes a file exceed it.
    EXPECT_TRUE(bytes <= o.max_shard_bytes || shard.entries().size() == 1) << f << " holds " << bytes;
    total += bytes;
  }
  EXPECT_EQ(index["metadata"]["total_size"], total);
  EXPECT_EQ(index["weight_map"].size(), params.size());

  // Read back: each file is mapped when a tensor in it is first needed.
  HfWeights weights(dir);
  auto built = build_from_hf_dir(dir, false);
  weights.validate(*built);
  const auto last = params.back();
  torch::Tensor value = torch::empty_like(last.second);
  HfWeights lazy(dir);
  lazy.fill(last.first, value);
  EXPECT_TRUE(value.equal(last.second));
  EXPECT_EQ(lazy.mapped_files(), std::vector<std::string>{index["weight_map"][last.first].get<std::string>()});
  auto loaded = load_hf_pretrained(dir);
  const auto b = params_of(*loaded);
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(params[i].second.equal(b[i].second)) << params[i].first;

  // Back to one file: the shards and the index go.
  save_hf_pretrained(*model, params, dir);
  EXPECT_FALSE(fs::exists(dir + "/" + hf::kIndexFile));
  for (const auto& f : files) EXPECT_FALSE(fs::exists(dir + "/" + f)) << f;
}

INSTANTIATE_TEST_SUITE_P(Families, Family, ::testing::ValuesIn(kTiny), [](const auto& info) {
  std::string name = info.param;
  for (auto& ch : name) ch = ch == '-' ? '_' : ch;
  return name;
});

TEST(HfIndex, ABrokenIndexIsNamed) {
  torch::manual_seed(6);
  auto model = build_preset("llama-tiny");
  const auto dir = temp_dir("broken-index");
  HfExportOptions o;
  o.max_shard_bytes = 100'000;
  save_hf_pretrained(*model, params_of(*model), dir, o);
  auto index = read_json(dir + "/" + hf::kIndexFile);
  index["weight_map"]["model.norm.weight"] = "../../etc/passwd";
  write_json(dir + "/" + hf::kIndexFile, index);
  EXPECT_NE(error_of([&] { HfWeights w(dir); }).find("not a file name inside the model directory"), std::string::npos);
  index["weight_map"]["model.norm.weight"] = "model-00009-of-00009.safetensors";
  write_json(dir + "/" + hf::kIndexFile, index);
  EXPECT_NE(error_of([&] { HfWeights w(dir); }).find("names 'model-00009-of-00009.safetensors', which is not in"),
            std::string::npos);
}

// transformers builds every decoder family's embedding with
// padding_idx=config.pad_token_id (GPT-2 excepted): the row starts at zero
// in a fresh model, the lookup gives it no gradient, and the id survives
// the export. A negative id counts from the end, as nn.Embedding's does.
TEST(HfConfig, PadTokenIdIsTheEmbeddingsPaddingRowAsInTransformers) {
  for (const std::string name : {"llama-tiny", "llama2-tiny", "mistral-tiny", "qwen3-tiny", "qwen3-moe-tiny",
                                 "llama4-tiny"}) {
    nlohmann::json config = hf_config(*build_preset(name));
    const int64_t vocab = config.at("vocab_size").get<int64_t>();
    config["pad_token_id"] = -2;  // row vocab - 2
    torch::manual_seed(0);
    auto model = build_from_hf_config(config, name);
    EXPECT_EQ(hf_config(*model).at("pad_token_id"), vocab - 2) << name << ": the export keeps the id";
    torch::Tensor embedding;
    for (const auto& [key, t] : params_of(*model)) {
      if (key.find("embed_tokens.weight") != std::string::npos) embedding = model->named_parameters()[key];
    }
    ASSERT_TRUE(embedding.defined()) << name;
    EXPECT_TRUE(embedding[vocab - 2].eq(0).all().item<bool>()) << name << ": a fresh model starts the row at zero";
    EXPECT_GT(embedding[vocab - 3].abs().sum().item<double>(), 0.0) << name;
    // A batch full of the pad id: the row gets nothing from the lookup (a
    // tied head still trains it, as in transformers), its neighbour does.
    const auto ids = torch::tensor({int64_t{1}, vocab - 2, vocab - 2, vocab - 3, vocab - 2}, torch::kLong).view({1, 5});
    const bool tied = config.value("tie_word_embeddings", false);
    torch::Tensor hidden = model->forward(ids);
    (tied ? hidden.sum() : hidden.pow(2).sum()).backward();
    ASSERT_TRUE(embedding.grad().defined()) << name;
    if (!tied) {
      EXPECT_TRUE(embedding.grad()[vocab - 2].eq(0).all().item<bool>()) << name << ": the padding row trained";
    }
    EXPECT_GT(embedding.grad()[vocab - 3].abs().sum().item<double>(), 0.0) << name;

    for (const int64_t bad : {vocab, -vocab - 1}) {
      config["pad_token_id"] = bad;
      EXPECT_NE(error_of([&] { build_from_hf_config(config, name); }).find("'pad_token_id' is " + std::to_string(bad)),
                std::string::npos)
          << name;
    }
  }
  // GPT-2's embedding has no padding row in transformers: the id changes nothing.
  nlohmann::json gpt2 = hf_config(*build_preset("gpt2-tiny"));
  gpt2["pad_token_id"] = 3;
  torch::manual_seed(0);
  auto model = build_from_hf_config(gpt2, "gpt2");
  EXPECT_GT(model->named_parameters()["transformer.wte.weight"][3].abs().sum().item<double>(), 0.0);
}

// transformers' Qwen3-MoE adds router_aux_loss_coef times the
// load-balancing loss to the training loss only when config.json sets
// output_router_logits (its default is false); the export says which.
TEST(Qwen3Moe, TheLoadBalancingLossJoinsTrainingOnlyWithOutputRouterLogits) {
  nlohmann::json config = hf_config(*build_preset("qwen3-moe-tiny"));
  EXPECT_EQ(config.at("output_router_logits"), true) << "the preset trains with it";
  const auto tokens = torch::arange(8, torch::kLong).view({1, 8});
  for (const bool on : {true, false}) {
    config["output_router_logits"] = on;
    auto model = build_from_hf_config(config, "qwen3_moe");
    model->forward(tokens);
    EXPECT_EQ(model->auxiliary_loss().defined(), on) << "output_router_logits " << on;
    EXPECT_EQ(hf_config(*model).at("output_router_logits"), on);
  }
  config.erase("output_router_logits");
  auto model = build_from_hf_config(config, "qwen3_moe");
  model->forward(tokens);
  EXPECT_FALSE(model->auxiliary_loss().defined()) << "transformers' default";
}

TEST(HfConfig, Transformers5SpellingBuildsTheSameModelAsTransformers4s) {
  // transformers 5 writes rope_theta and the scaling inside one
  // rope_parameters object, and Qwen3-MoE's num_experts as
  // num_local_experts; tests/reference/logits_test.py checks the logits
  // against transformers itself, this the reading and the refusals.
  nlohmann::json v4 = hf_config(*build_preset("llama3.2-1b"));
  nlohmann::json v5 = v4;
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = v4["rope_scaling"];
  v5["rope_parameters"]["rope_theta"] = v4["rope_theta"];
  const auto a = llama_config_from_hf(v4, "v4"), b = llama_config_from_hf(v5, "v5");
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(b.rope_theta, 500000.0);
  EXPECT_EQ(a.rope_scaling.rope_type, "llama3");
  EXPECT_EQ(b.rope_scaling.rope_type, "llama3");
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
  EXPECT_EQ(a.rope_scaling.original_max_position_embeddings, b.rope_scaling.original_max_position_embeddings);
  auto both = v5;
  both["rope_theta"] = 10000.0;
  EXPECT_NE(error_of([&] { llama_config_from_hf(both, "both"); }).find("rope_theta 10000 disagrees with rope_parameters.rope_theta 500000"),
            std::string::npos);
  auto yarn = v5;
  yarn["rope_parameters"]["rope_type"] = "yarn";
  EXPECT_NE(error_of([&] { llama_config_from_hf(yarn, "yarn"); }).find("rope_parameters type 'yarn'"), std::string::npos);
  auto no_theta = v5;
  no_theta["rope_parameters"].erase("rope_theta");
  EXPECT_NE(error_of([&] { llama_config_from_hf(no_theta, "x"); }).find("numeric rope_theta"), std::string::npos);

  nlohmann::json moe = hf_config(*build_preset("qwen3-moe-tiny"));
  const int64_t experts = moe["num_experts"];
  moe["num_local_experts"] = experts;
  moe.erase("num_experts");
  EXPECT_EQ(qwen3_moe_config_from_hf(moe, "v5").moe.num_experts, experts);
  moe["num_experts"] = experts + 1;
  EXPECT_NE(error_of([&] { qwen3_moe_config_from_hf(moe, "x"); }).find("num_experts and num_local_experts disagree"),
            std::string::npos);
}

// [Note: dimension limits]: a config.json asking for 2^40 layers (or 10^9)
// was built until memory ran out, before any weight was read. Each family's
// sizes are refused at their limit, quickly, naming it.
TEST(HfConfig, DimensionsPastAnyModelAreRefusedBeforeAnythingIsBuilt) {
  torch::manual_seed(7);
  for (const std::string preset : {"llama-tiny", "gpt2-tiny", "qwen3-tiny"}) {
    auto model = build_preset(preset);
    const auto dir = temp_dir("huge-" + preset);
    save_hf_pretrained(*model, params_of(*model), dir);
    const auto good = read_json(dir + "/config.json");
    const bool gpt2 = preset == "gpt2-tiny";
    for (const auto& [key, value, limit] :
         {std::tuple{gpt2 ? "n_layer" : "num_hidden_layers", int64_t{1} << 40, "4096"},
          std::tuple{gpt2 ? "n_layer" : "num_hidden_layers", int64_t{1000000000}, "4096"},
          std::tuple{gpt2 ? "n_embd" : "hidden_size", int64_t{1} << 20, "65536"},
          std::tuple{"vocab_size", int64_t{1} << 30, "16777216"}}) {
      auto c = good;
      c[key] = value;
      write_json(dir + "/config.json", c);
      const auto start = std::chrono::steady_clock::now();
      const auto what = error_of([&] { build_from_hf_dir(dir, false); });
      EXPECT_NE(what.find(std::string("'") + key + "' is " + std::to_string(value) + " (expected a size from 1 to " +
                          limit + "; no published model comes near it"),
                std::string::npos)
          << preset << ": " << what;
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << preset << " " << key;
    }
  }
}

TEST(HfConfig, KeysThatChangeTheArchitectureAndAreNotImplementedAreRefusedByName) {
  torch::manual_seed(7);
  auto model = build_preset("llama-tiny");
  const auto dir = temp_dir("refused");
  save_hf_pretrained(*model, params_of(*model), dir);
  const auto good = read_json(dir + "/config.json");
  const auto refused = [&](const std::string& key, const nlohmann::json& value) {
    auto c = good;
    c[key] = value;
    write_json(dir + "/config.json", c);
    return error_of([&] { build_from_hf_dir(dir, false); });
  };
  EXPECT_NE(refused("attention_bias", true).find("sets 'attention_bias' to true"), std::string::npos);
  EXPECT_NE(refused("hidden_act", "gelu").find("'hidden_act'"), std::string::npos);
  EXPECT_NE(refused("mlp_bias", true).find("'mlp_bias'"), std::string::npos);
  EXPECT_NE(refused("rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}).find("rope_scaling type 'yarn'"),
            std::string::npos);
  // Found by the hf_config fuzz target: a float where a size belongs reached
  // nlohmann's unchecked conversion to int64_t.
  EXPECT_NE(refused("num_hidden_layers", 7.7e58).find("'num_hidden_layers' must be a whole number"), std::string::npos);
  // Also found by it: a rope type that is not a string escaped as nlohmann's type_error.
  EXPECT_NE(refused("rope_scaling", {{"rope_type", 0}, {"factor", 4.0}})
                .find("rope_scaling 'rope_type' is 0: expected a name such as \"default\" or \"llama3\""),
            std::string::npos);
  EXPECT_NE(refused("hidden_size", 0).find("'hidden_size' is 0 (expected a size from 1 to 65536)"), std::string::npos);
  EXPECT_NE(refused("rms_norm_eps", -1e-6).find("'rms_norm_eps' is -1e-06 (expected a positive number)"),
            std::string::npos);
  EXPECT_NE(refused("rope_theta", -10000.0).find("'rope_theta' is -10000 (expected a positive number)"),
            std::string::npos);
  EXPECT_NE(refused("attention_dropout", 1.5).find("'attention_dropout' is 1.5 (expected a probability"),
            std::string::npos);
  EXPECT_NE(refused("partial_rotary_factor", 0.5).find("key 'partial_rotary_factor' (0.5) is not known"),
            std::string::npos);
  // Keys that do not change the architecture are accepted.
  auto c = good;
  c["use_cache"] = false;
  c["bos_token_id"] = 128000;
  c["pretraining_tp"] = 1;
  write_json(dir + "/config.json", c);
  EXPECT_NO_THROW(build_from_hf_dir(dir, false));
  // Qwen3's sliding window.
  auto q = read_json(dir + "/config.json");
  q["model_type"] = "qwen3";
  q["use_sliding_window"] = true;
  write_json(dir + "/config.json", q);
  EXPECT_NE(error_of([&] { build_from_hf_dir(dir, false); }).find("'use_sliding_window'"), std::string::npos);
  q["model_type"] = "mixtral";
  write_json(dir + "/config.json", q);
  EXPECT_NE(error_of([&] { build_from_hf_dir(dir, false); })
                .find("model_type 'mixtral' is not supported (expected gpt2, llama, mistral, qwen3, qwen3_moe, "
                      "llama4_text, llama4)"),
            std::string::npos);
  // Mistral's window: none, or one that cuts nothing, is Llama; a shorter one is refused by name.
  auto m = good;
  m["model_type"] = "mistral";
  m["sliding_window"] = nullptr;
  write_json(dir + "/config.json", m);
  EXPECT_EQ(build_from_hf_dir(dir, false)->family(), "mistral");
  m["sliding_window"] = m["max_position_embeddings"];
  write_json(dir + "/config.json", m);
  EXPECT_NO_THROW(build_from_hf_dir(dir, false));
  m["sliding_window"] = 4;
  write_json(dir + "/config.json", m);
  EXPECT_NE(error_of([&] { build_from_hf_dir(dir, false); }).find("sliding_window 4 is shorter than"),
            std::string::npos);
  m.erase("sliding_window");  // absent: transformers' default, 4096, cuts an 8192-position model
  m["max_position_embeddings"] = 8192;
  write_json(dir + "/config.json", m);
  EXPECT_NE(error_of([&] { build_from_hf_dir(dir, false); }).find("sliding_window 4096 (transformers' default)"),
            std::string::npos);
}

TEST(Llama31, RopeScalingMatchesTheFormulaComputedHere) {
  // Llama 3.1's published rope_scaling: factor 8, low 1, high 4, original
  // context 8192, theta 500000, head size 128. Each frequency computed in
  // double from the definition.
  const RopeScaling s{"llama3", 8.0, 1.0, 4.0, 8192};
  const int64_t hs = 128;
  const double theta = 500000.0;
  const auto got = rope_inv_freq(hs, theta, s);
  int low = 0, high = 0, blended = 0;
  for (int64_t i = 0; i < hs / 2; ++i) {
    const double f = std::pow(theta, -2.0 * static_cast<double>(i) / hs);
    const double wavelength = 2 * M_PI / f;
    double expected;
    if (wavelength < 8192.0 / 4.0) {
      expected = f, ++high;
    } else if (wavelength > 8192.0 / 1.0) {
      expected = f / 8.0, ++low;
    } else {
      const double t = (8192.0 / wavelength - 1.0) / (4.0 - 1.0);
      expected = (1 - t) * f / 8.0 + t * f, ++blended;
    }
    EXPECT_NEAR(got[i].item<double>(), expected, 1e-6 * expected) << i;
  }
  EXPECT_GT(low, 0);
  EXPECT_GT(high, 0);
  EXPECT_GT(blended, 0);
  // Without scaling: the plain frequencies.
  EXPECT_NEAR(rope_inv_freq(hs, theta)[hs / 2 - 1].item<double>(), std::pow(theta, -2.0 * 63 / hs), 1e-12);
}

TEST(Llama31, RopeScalingRoundTripsThroughConfigJson) {
  torch::manual_seed(8);
  auto c = llama_preset("llama-tiny");
  c.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 32};
  c.tie_word_embeddings = true;
  auto model = std::make_shared<LlamaForCausalLMImpl>(c);
  const auto dir = temp_dir("rope");
  save_hf_pretrained(*model, params_of(*model), dir);
  const auto j = read_json(dir + "/config.json");
  EXPECT_EQ(j["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(j["tie_word_embeddings"], true);
  auto loaded = load_hf_pretrained(dir);
  auto& l = dynamic_cast<LlamaForCausalLMImpl&>(*loaded);
  EXPECT_EQ(l.config.rope_scaling.factor, 8.0);
  EXPECT_EQ(l.config.rope_scaling.original_max_position_embeddings, 32);
  EXPECT_FALSE(l.lm_head) << "tied";
  auto tokens = torch::randint(0, 512, {2, 64}, torch::kLong);
  EXPECT_TRUE(model->forward(tokens).equal(loaded->forward(tokens)));
  // The scaling changes the model: positions far apart rotate differently.
  auto unscaled = c;
  unscaled.rope_scaling = {};
  LlamaForCausalLMImpl plain(unscaled);
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : params_of(plain)) plain.named_parameters()[name].copy_(loaded->named_parameters()[name]);
  EXPECT_FALSE(torch::allclose(plain.forward(tokens), loaded->forward(tokens), 1e-4, 1e-4));
}

TEST(TiedLlama, ACheckpointThatAlsoHoldsTheHeadLoads) {
  // Some tied checkpoints save lm_head.weight too (equal to the embedding).
  torch::manual_seed(9);
  auto c = llama_preset("llama-tiny");
  c.tie_word_embeddings = true;
  LlamaForCausalLMImpl model(c);
  const auto dir = temp_dir("tied-head");
  auto params = params_of(model);
  save_hf_pretrained(model, params, dir);
  params.emplace_back("lm_head.weight", model.model->embed_tokens->weight.detach());
  io::write_safetensors(dir + "/model.safetensors", params);
  auto loaded = load_hf_pretrained(dir);
  EXPECT_TRUE(loaded->output_weight().equal(model.model->embed_tokens->weight));
}

}  // namespace
}  // namespace fsdp::models::families_test
