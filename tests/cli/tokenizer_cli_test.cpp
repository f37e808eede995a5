// Hugging Face tokenizers through the CLI: `fsdp data prepare` and `fsdp
// data encode` with a tokenizer.json give the reference encoder's ids
// (@huggingface/tokenizers, run by Node.js) in llm.c's wide token files,
// each document after the tokenizer's separator; `fsdp generate` and
// `fsdp train` take the model directory's tokenizer, and --export-hf
// carries it into the exported directory.

#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../test_paths.h"
#include "../unit/reference_encoder.h"
#include "fsdp/data/token_file.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/models/hf/weights.h"
#include "fsdp/models/registry.h"
#include "fsdp/train/generate.h"
#include "run_command.h"
#include "train_support.h"

namespace fsdp::testing::tokenizer_cli_test {
namespace {

namespace fs = std::filesystem;
const std::string kCli = kCliProgram;
const std::string kData = std::string(kSourceDir) + "/data";

const std::vector<std::string> kDocuments = {
    "The first document: café, 日本語, 12345 and emoji 👋.",
    "  Second one,\n\nwith  whitespace runs\tand I'M SHOUTING contractions.",
    "<|im_start|>third<|im_end|> with special tokens <|endoftext|>",
};

std::vector<int64_t> tokens_of(const std::string& path) {
  data::TokenFile file(path);
  std::vector<int64_t> out(static_cast<size_t>(file.size()));
  file.read(0, file.size(), out.data());
  return out;
}

TEST(TokenizerCli, PrepareWithATokenizerJsonWritesTheReferenceIdsAfterEachSeparator) {
  for (const auto& [name, separator] :
       std::vector<std::pair<std::string, int64_t>>{{"llama3", 128000}, {"qwen3", 151643}, {"mistral", 1}}) {
    const auto dir = kData + "/" + name;
    if (const auto why = reference_missing("hf", dir); !why.empty()) GTEST_SKIP() << why;
    const auto out = make_temp_dir();
    {
      std::ofstream jsonl(out + "/docs.jsonl");
      for (const auto& d : kDocuments) jsonl << nlohmann::json({{"text", d}}).dump() << "\n";
    }
    const auto r = run_command(kCli + " data prepare --input " + out + "/docs.jsonl --out-dir " + out +
                               " --val-fraction 0 --tokenizer " + dir);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "documents start with token " + std::to_string(separator))) << r.output;
    std::vector<int64_t> expected;
    for (const auto& ids : reference_ids("hf", dir, kDocuments)) {
      expected.push_back(separator);
      expected.insert(expected.end(), ids.begin(), ids.end());
    }
    EXPECT_EQ(tokens_of(out + "/train.bin"), expected) << name;
    // llm.c's layouts: 256 int32 of header, then uint32 tokens (Llama 3,
    // Qwen3), or uint16 for vocabularies up to 65,536 (Mistral's 32,000).
    const size_t width = name == "mistral" ? 2 : 4;
    EXPECT_EQ(fs::file_size(out + "/train.bin"), 1024 + width * expected.size()) << name;

    std::ofstream(out + "/one.txt") << kDocuments[0];
    const auto encoded = run_command(kCli + " data encode --tokenizer " + dir + " < " + out + "/one.txt");
    ASSERT_EQ(encoded.exit_code, 0) << encoded.output;
    const auto reference = reference_ids("hf", dir, {kDocuments[0]});
    ASSERT_EQ(reference.size(), 1u);
    std::string line;
    for (const auto id : reference[0]) line += (line.empty() ? "" : ",") + std::to_string(id);
    EXPECT_TRUE(contains(encoded.output, line + "\n")) << encoded.output << " vs " << line;
  }
}

TEST(TokenizerCli, EncodeEachLineGivesEveryLineItsReferenceIdsAndSaysWhichAreRefused) {
  const auto dir = kData + "/llama3";
  if (const auto why = reference_missing("hf", dir); !why.empty()) GTEST_SKIP() << why;
  const auto out = make_temp_dir();
  // Lines of text: an empty one gets an empty line, the last one has no newline.
  const std::vector<std::string> texts = {kDocuments[0], "", "Hello world!", "  indented, then unicode: caf\u00e9"};
  {
    std::ofstream in(out + "/lines.txt");
    for (size_t i = 0; i < texts.size(); ++i) in << texts[i] << (i + 1 < texts.size() ? "\n" : "");
  }
  const auto r = run_command(kCli + " data encode --each-line --tokenizer " + dir + " < " + out + "/lines.txt");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string expected;
  for (const auto& ids : reference_ids("hf", dir, texts)) {
    std::string line;
    for (const auto id : ids) line += (line.empty() ? "" : ",") + std::to_string(id);
    expected += line + "\n";
  }
  EXPECT_EQ(r.output, expected);

  // Conversations: a line that is not JSON says why on its own line, the
  // others are still encoded (as each alone), and the exit status is 1.
  const std::string record =
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})";
  std::ofstream(out + "/one.jsonl") << record << "\n";
  std::ofstream(out + "/chats.jsonl") << record << "\n{not json\n" << record << "\n";
  const auto alone = run_command(kCli + " data encode --chat --tokenizer " + dir + " < " + out + "/one.jsonl");
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  const auto each = run_command("(" + kCli + " data encode --chat --each-line --tokenizer " + dir + " < " + out +
                                "/chats.jsonl 2> " + out + "/stderr.txt)");
  EXPECT_EQ(each.exit_code, 1) << each.output;
  std::istringstream lines(each.output);
  std::vector<std::string> got;
  for (std::string line; std::getline(lines, line);) got.push_back(line);
  ASSERT_EQ(got.size(), 3u) << each.output;
  EXPECT_EQ(got[0] + "\n", alone.output);
  EXPECT_EQ(got[2] + "\n", alone.output);
  EXPECT_TRUE(got[1].rfind("error: ", 0) == 0 && contains(got[1], "line 2") && contains(got[1], "not valid JSON"))
      << got[1];
  std::ifstream err(out + "/stderr.txt");
  const std::string said((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(contains(said, "1 of 3 line(s) refused")) << said;
  // A message of an unknown role, or without content, is refused on its
  // line as `data prepare` refuses it (an empty line, or the template's
  // internal error, before).
  std::ofstream(out + "/roles.jsonl")
      << R"({"messages": [{"role": "bot", "content": "hi"}]})" << "\n"
      << R"({"messages": [{"role": "user"}]})" << "\n";
  const auto roles = run_command("(" + kCli + " data encode --chat --each-line --tokenizer " + dir + " < " + out +
                                 "/roles.jsonl 2> /dev/null)");
  EXPECT_EQ(roles.exit_code, 1) << roles.output;
  std::istringstream role_lines(roles.output);
  std::vector<std::string> refused;
  for (std::string line; std::getline(role_lines, line);) refused.push_back(line);
  ASSERT_EQ(refused.size(), 2u) << roles.output;
  EXPECT_TRUE(contains(refused[0], "has the role 'bot'; expected one of system, user, assistant, tool")) << refused[0];
  EXPECT_TRUE(contains(refused[1], "(user) has no string \"content\"")) << refused[1];
  // --render prints text that may span lines: not with --each-line.
  EXPECT_NE(run_command(kCli + " data encode --chat --render --each-line --tokenizer " + dir + " < " + out +
                        "/chats.jsonl").exit_code,
            0);
}

TEST(TokenizerCli, GenerateAndTrainTakeTheModelDirectorysTokenizerAndExportCarriesIt) {
  const auto qwen = kData + "/qwen3";
  if (const auto why = reference_missing("hf", qwen); !why.empty()) GTEST_SKIP() << why;
  // A one-layer Qwen3 with the real vocabulary (151,936 rows).
  const auto dir = make_temp_dir();
  const auto model = write_model_dir("qwen3-tiny", 151936, qwen, dir + "/model");

  // The prompt's ids come from the reference encoder; the continuation
  // from the model in this process, greedily.
  const std::string prompt = "<|im_start|>user\nBonjour, café";
  const auto reference = reference_ids("hf", qwen, {prompt});
  ASSERT_EQ(reference.size(), 1u);
  const auto& prompt_ids = reference[0];
  train::SampleOptions greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 6;
  const auto continuation = train::generate(models::load_hf_pretrained(dir + "/model"), prompt_ids, greedy);
  const auto generated = run_command(kCli + " generate --from " + dir + "/model --prompt '" + prompt +
                                     "' --temperature 0 --max-new-tokens 6");
  ASSERT_EQ(generated.exit_code, 0) << generated.output;
  EXPECT_TRUE(contains(generated.output, "generate: tokenizer '" + dir + "/model/tokenizer.json'")) << generated.output;
  EXPECT_TRUE(contains(generated.output, prompt + data::Tokenizer::from_dir(qwen)->decode(continuation) + "\n"))
      << generated.output;

  // Training from the directory samples with its tokenizer and exports it.
  std::vector<int32_t> corpus;
  for (int i = 0; i < 400; ++i) corpus.push_back(i * 7919 % 151643);
  data::write_token_file(dir + "/train.bin", corpus, 151936);
  const auto trained = run_command(kCli + " train --init-from " + dir + "/model --data " + dir +
                                   "/train.bin --seq-len 16 --batch-size 2 --steps 1 --sample-tokens 2 --out-dir " +
                                   dir + "/run --export-hf " + dir + "/export");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_TRUE(contains(trained.output, "samples use the tokenizer '" + dir + "/model/tokenizer.json'"))
      << trained.output;
  EXPECT_EQ(read_file(dir + "/export/tokenizer.json"), read_file(qwen + "/tokenizer.json"));
  EXPECT_EQ(read_file(dir + "/export/tokenizer_config.json"), read_file(qwen + "/tokenizer_config.json"));
}

TEST(TokenizerCli, ALlama2ShapedModelTrainsOnSentencePieceTokensSamplesExportsAndGenerates) {
  // Llama 2's form end to end: a tokenizer.json in its format (Mistral's
  // file, data/mistral) prepares the data, llama2-tiny (32,000 rows)
  // trains on it and samples, the export generates text from a prompt.
  const auto tokenizer = kData + "/mistral";
  if (const auto why = reference_missing("hf", tokenizer); !why.empty()) GTEST_SKIP() << why;
  const auto dir = make_temp_dir();
  {
    std::ofstream jsonl(dir + "/docs.jsonl");
    for (int i = 0; i < 20; ++i) jsonl << nlohmann::json({{"text", kDocuments[static_cast<size_t>(i % 3)]}}).dump() << "\n";
  }
  const auto prepared = run_command(kCli + " data prepare --input " + dir + "/docs.jsonl --out-dir " + dir +
                                    "/tokens --val-fraction 0 --tokenizer " + tokenizer);
  ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
  const auto trained = run_command(kCli + " train --model llama2-tiny --data " + dir + "/tokens/train.bin --tokenizer " +
                                   tokenizer + " --seq-len 16 --batch-size 2 --steps 2 --sample-tokens 3" +
                                   " --sample-prompt 'Hello' --out-dir " + dir + "/run --export-hf " + dir + "/export");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_TRUE(contains(trained.output, "--- sample (3 tokens) ---\nHello")) << trained.output;

  const std::string prompt = "Hello world, café";
  const auto reference = reference_ids("hf", tokenizer, {prompt});
  ASSERT_EQ(reference.size(), 1u);
  train::SampleOptions greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 5;
  const auto continuation = train::generate(models::load_hf_pretrained(dir + "/export"), reference[0], greedy);
  const auto generated = run_command(kCli + " generate --from " + dir + "/export --tokenizer " + tokenizer +
                                     " --prompt '" + prompt + "' --temperature 0 --max-new-tokens 5");
  ASSERT_EQ(generated.exit_code, 0) << generated.output;
  const auto text = data::Tokenizer::from_dir(tokenizer)->decode_continuation(reference[0], continuation);
  EXPECT_TRUE(contains(generated.output, prompt + text + "\n")) << generated.output << " vs " << text;
}

// Token files know their tokenizer: `data prepare` records it beside them
// (the same vocabulary read from GPT-2's BPE files or from its
// tokenizer.json records the same), and `train --init-from` refuses data
// another tokenizer made, naming both, unless told it is intended.
TEST(TokenizerCli, TrainRefusesTokenFilesAnotherTokenizerMade) {
  const auto llama3 = kData + "/llama3";
  if (!fs::exists(llama3 + "/tokenizer.json") || !fs::exists(kData + "/gpt2-hf/tokenizer.json")) {
    GTEST_SKIP() << "data/llama3 or data/gpt2-hf is missing (scripts/fetch_data.sh)";
  }
  const auto dir = make_temp_dir();
  {
    std::ofstream jsonl(dir + "/docs.jsonl");
    for (int i = 0; i < 30; ++i) jsonl << nlohmann::json({{"text", "Document " + std::to_string(i) + " says hello."}}).dump() << "\n";
  }
  auto prepare = [&](const std::string& tokenizer, const std::string& out) {
    const auto r = run_command(kCli + " data prepare --input " + dir + "/docs.jsonl --val-fraction 0 --tokenizer " +
                               tokenizer + " --out-dir " + dir + "/" + out);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::ifstream in(dir + "/" + out + "/tokenizer_record.json");
    return nlohmann::json::parse(in);
  };
  const auto bpe = prepare(kData + "/gpt2", "gpt2");
  const auto json = prepare(kData + "/gpt2-hf", "gpt2-hf");
  const auto llama = prepare(llama3, "llama3");
  EXPECT_EQ(bpe["vocabulary_fingerprint"], json["vocabulary_fingerprint"]) << "GPT-2's vocabulary either way";
  EXPECT_EQ(bpe["vocab_size"], 50257);
  EXPECT_NE(bpe["vocabulary_fingerprint"], llama["vocabulary_fingerprint"]);
  EXPECT_EQ(llama["document_separator"], 128000);

  write_model_dir("llama-tiny", 128256, llama3, dir + "/model");

  const auto train = [&](const std::string& data, const std::string& extra) {
    return run_command(kCli + " train --init-from " + dir + "/model --data " + dir + "/" + data +
                       "/train.bin --steps 1 --seq-len 8 --batch-size 2 --out-dir " + dir + "/run-" + data + extra);
  };
  const auto refused = train("gpt2", "");
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_TRUE(contains(refused.output, "was tokenized by '" + kData + "/gpt2/encoder.json'")) << refused.output;
  EXPECT_TRUE(contains(refused.output, "(50257 tokens), not by --init-from's")) << refused.output;
  EXPECT_TRUE(contains(refused.output, "(128256 tokens): its ids mean other text to this model")) << refused.output;
  EXPECT_TRUE(contains(refused.output, "--allow-tokenizer-mismatch")) << refused.output;
  const auto allowed = train("gpt2", " --allow-tokenizer-mismatch");
  EXPECT_EQ(allowed.exit_code, 0) << allowed.output;
  const auto matching = train("llama3", "");
  EXPECT_EQ(matching.exit_code, 0) << matching.output;
  EXPECT_TRUE(contains(matching.output, "tokenized by '" + llama3 + "/tokenizer.json' (128256 tokens)"))
      << matching.output;

  // Every file is checked, not only the first: the model's own data beside
  // another tokenizer's is refused naming both files, with --init-from or
  // a preset (GPT-2's ids are all valid Llama 3 ids, so nothing else would
  // notice).
  const std::string mixed = " --data " + dir + "/llama3/train.bin," + dir + "/gpt2/train.bin";
  int run = 0;
  for (const std::string& model :
       std::vector<std::string>{" --init-from " + dir + "/model", " --model llama-tiny --vocab-size 128256"}) {
    const auto r = run_command(kCli + " train" + model + mixed + " --steps 1 --seq-len 8 --batch-size 2 --out-dir " +
                               dir + "/run-mixed" + std::to_string(run++));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(contains(r.output, "mixes token files of two tokenizers: '" + dir + "/llama3/train.bin' was tokenized "
                                   "by '" + llama3 + "/tokenizer.json' (128256 tokens), '" + dir +
                                   "/gpt2/train.bin' by '" + kData + "/gpt2/encoder.json' (50257 tokens)"))
        << r.output;
  }
  // A file with no record listed beside recorded ones is refused, naming
  // both (its tokenizer is unknown); on its own it trains as llm.c's files do.
  fs::create_directories(dir + "/bare");
  fs::copy_file(dir + "/gpt2/train.bin", dir + "/bare/train.bin");
  const auto unrecorded = run_command(kCli + " train --init-from " + dir + "/model --data " + dir +
                                      "/llama3/train.bin," + dir + "/bare/train.bin --steps 1 --seq-len 8 "
                                      "--batch-size 2 --out-dir " + dir + "/run-unrecorded");
  EXPECT_EQ(unrecorded.exit_code, 1) << unrecorded.output;
  EXPECT_TRUE(contains(unrecorded.output, "'" + dir + "/bare/train.bin' has no tokenizer_record.json beside it, while '" +
                                              dir + "/llama3/train.bin' was tokenized by '" + llama3 +
                                              "/tokenizer.json' (128256 tokens)"))
      << unrecorded.output;
  EXPECT_FALSE(exists(dir + "/run-unrecorded"));
  // A preset's --tokenizer (for its samples) is compared with the data's
  // record as --init-from's is.
  const auto preset = run_command(kCli + " train --model llama-tiny --vocab-size 128256 --tokenizer " + llama3 +
                                  " --data " + dir + "/gpt2/train.bin --steps 1 --seq-len 8 --batch-size 2 "
                                  "--out-dir " + dir + "/run-preset");
  EXPECT_EQ(preset.exit_code, 1) << preset.output;
  EXPECT_TRUE(contains(preset.output, "(50257 tokens), not by --tokenizer's '" + llama3 + "/tokenizer.json' (128256"))
      << preset.output;
}

TEST(ReadmeExamples, DataEncodeLinesPrintTheIdsTheirCommentsSay) {
  // Every `echo "..." | build/fsdp data encode ...  # ids` line of
  // docs/training.md ("Data"), run as written (from the source directory)
  // and compared with its comment.
  std::ifstream readme(std::string(kSourceDir) + "/docs/training.md");
  ASSERT_TRUE(readme.good());
  const std::regex example(R"re(^(echo "[^"]*" \| )build/fsdp( data encode[^#]*?)\s+# ([0-9,]+)$)re");
  std::string line;
  int checked = 0;
  while (std::getline(readme, line)) {
    std::smatch m;
    if (!std::regex_match(line, m, example)) continue;
    const std::string args = m[2];
    if (!fs::exists(kData + "/gpt2/encoder.json")) GTEST_SKIP() << "needs data/ (scripts/fetch_data.sh)";
    const auto r = run_command("cd " + std::string(kSourceDir) + " && " + std::string(m[1]) + kCli + args);
    ASSERT_EQ(r.exit_code, 0) << line << "\n" << r.output;
    EXPECT_EQ(r.output, std::string(m[3]) + "\n") << line;
    ++checked;
  }
  EXPECT_GE(checked, 2) << "the data encode examples of docs/training.md were not found";
}

TEST(Preference, PairsPrepareAndTrainWithDpoAndWhatDoesNotFitIsRefusedByName) {
  const auto qwen = kData + "/qwen3";
  if (const auto why = reference_missing("hf", qwen); !why.empty()) GTEST_SKIP() << why;
  const auto dir = make_temp_dir();
  write_model_dir("qwen3-tiny", 151936, qwen, dir + "/model");
  const auto write = [&](const std::string& name, const std::vector<nlohmann::json>& records) {
    std::ofstream out(dir + "/" + name);
    for (const auto& r : records) out << r.dump() << "\n";
    return dir + "/" + name;
  };
  const auto pair = [](const std::string& q) {
    return nlohmann::json{{"prompt", {{{"role", "user"}, {"content", q}}}},
                          {"chosen", {{{"role", "assistant"}, {"content", "Yes."}}}},
                          {"rejected", {{{"role", "assistant"}, {"content", "No, never."}}}}};
  };
  const auto prepare = [&](const std::string& input, const std::string& out) {
    return run_command(kCli + " data prepare --input " + input + " --out-dir " + dir + "/" + out +
                       " --val-fraction 0 --tokenizer " + dir + "/model");
  };
  const auto prepared = prepare(write("pairs.jsonl", {pair("Is it?"), pair("Really?"), pair("Sure?")}), "pairs");
  ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
  EXPECT_TRUE(contains(prepared.output, "3 preference pairs")) << prepared.output;
  const auto sft = prepare(write("sft.jsonl", {{{"messages", {{{"role", "user"}, {"content", "Hi"}},
                                                               {{"role", "assistant"}, {"content", "Hello."}}}}}}),
                           "sft");
  ASSERT_EQ(sft.exit_code, 0) << sft.output;

  // Data of the other kind, mixed kinds and a pair without its prompt.
  auto mixed = pair("Is it?");
  const auto refused_mix = prepare(write("mixed.jsonl", {pair("Is it?"), {{"prompt", "Q"}, {"completion", "A"}}}), "mixed");
  EXPECT_NE(refused_mix.exit_code, 0);
  EXPECT_TRUE(contains(refused_mix.output, "is no preference record")) << refused_mix.output;
  mixed.erase("prompt");
  const auto no_prompt = prepare(write("no-prompt.jsonl", {mixed}), "no-prompt");
  EXPECT_NE(no_prompt.exit_code, 0);
  EXPECT_TRUE(contains(no_prompt.output, "needs its \"prompt\" apart")) << no_prompt.output;

  const std::string train = kCli + " train --init-from " + dir + "/model --seq-len 32 --batch-size 1 --steps 2 " +
                            "--sample-tokens 0 --tensorboard=false --out-dir " + dir + "/run";
  const std::string pairs = " --data " + dir + "/pairs/train.bin";
  const std::pair<std::string, std::string> refusals[] = {
      {train + pairs, "which train with --objective dpo"},
      {train + " --objective dpo --data " + dir + "/sft/train.bin", "--objective dpo trains on preference pairs, and --data"},
      {kCli + " train --model qwen3-tiny --objective dpo --steps 1 --out-dir " + dir + "/run" + pairs,
       "needs it as --init-from DIR"},
      {train + " --objective dpo --pack" + pairs, "--pack does not apply"},
      {train + " --objective dpo --dpo-beta 0" + pairs, "objective.beta is 0: expected a positive number"}};
  for (const auto& [command, message] : refusals) {
    const auto refused = run_command(command);
    EXPECT_NE(refused.exit_code, 0) << command;
    EXPECT_TRUE(contains(refused.output, message)) << command << "\n" << refused.output;
  }
  EXPECT_FALSE(fs::exists(dir + "/run")) << "a refused start left its run folder";

  // The pairs train, and the step line and metrics say how the pairs fare.
  const auto trained = run_command(train + " --objective dpo --data " + dir + "/pairs/train.bin");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_TRUE(contains(trained.output, "reward acc")) << trained.output;
  EXPECT_TRUE(contains(trained.output, "DPO: the reference is the starting model")) << trained.output;
  std::ifstream metrics(dir + "/run/metrics.jsonl");
  int steps = 0;
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("rewards/accuracies")) continue;
    ++steps;
    EXPECT_GE(j["rewards/accuracies"].get<double>(), 0.0);
    EXPECT_LE(j["rewards/accuracies"].get<double>(), 1.0);
  }
  EXPECT_EQ(steps, 2);
}

}  // namespace
}  // namespace fsdp::testing::tokenizer_cli_test
