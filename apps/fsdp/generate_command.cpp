// `fsdp generate`: sample text from a Hugging Face directory (for example
// one written by `fsdp train --export-hf`).

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include <filesystem>

#include "commands.h"
#include "fsdp/common/error.h"
#include "fsdp/data/chat_data.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/io/input_file.h"
#include "fsdp/models/hf/peft_adapter.h"
#include "fsdp/models/hf/weights.h"
#include "fsdp/train/generate.h"
#include "fsdp/train/hf_companions.h"

namespace fsdp::cli {
namespace {

// GPT-2's tokenizer stands in for a directory without one only for a model
// of GPT-2's vocabulary, at most padded (nanoGPT's 50,304 rows).
constexpr int64_t kVocabPadding = 1024;

// A tokenizer whose ids the model cannot look up, or, taken by default, one
// that is plainly not the model's, would print a wrong text and exit 0.
void check_tokenizer_fits(const data::Tokenizer& tokenizer, int64_t model_vocab, const std::string& from,
                          bool implicit_default) {
  const int64_t vocab = tokenizer.vocab_size();
  FSDP_CHECK(vocab <= model_vocab, "the tokenizer ", tokenizer.source(), " has ", vocab,
             " tokens, more than the vocabulary of ", model_vocab, " of the model in '", from,
             "': it is not the model's (pass its tokenizer with --tokenizer DIR)");
  FSDP_CHECK(!implicit_default || model_vocab < vocab + kVocabPadding, "'", from,
             "' holds no tokenizer, and the default, GPT-2's ", tokenizer.source(), " (", vocab,
             " tokens), is not this model's (", model_vocab, " tokens): pass the model's tokenizer with --tokenizer DIR "
             "(a directory with its tokenizer.json)");
}

}  // namespace

void add_generate_command(CLI::App& app, int& exit_code) {
  struct Flags {
    std::string from, prompt = "\n", tokenizer, system, adapter;
    bool ignore_eos = false, chat = false;
    std::vector<std::string> stop;
    train::SampleOptions sample;
  };
  auto f = std::make_shared<Flags>();
  auto* cmd = app.add_subcommand("generate", "sample text from a Hugging Face model directory");
  cmd->add_option("--from", f->from, "Hugging Face directory (config.json + model.safetensors)")->required();
  cmd->add_option("--adapter", f->adapter,
                  "a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors, as `fsdp train "
                  "--lora-rank` exports it) to run on the --from model, its base");
  cmd->add_option("--prompt", f->prompt, "text to continue (with --chat: the user's message)");
  cmd->add_flag("--chat", f->chat,
                "the prompt is a user's message: rendered with the model's chat template (chat_template.jinja or "
                "tokenizer_config.json's, as apply_chat_template with add_generation_prompt), the reply generated");
  cmd->add_option("--system", f->system, "with --chat: a system message before the user's");
  // CLI::NonNegativeNumber's message prints DBL_MAX in full, 309 digits.
  const CLI::Validator non_negative(
      [](std::string& v) { return std::strtod(v.c_str(), nullptr) >= 0 ? "" : "expected 0 or more, got " + v; },
      "NONNEGATIVE");
  cmd->add_option("--max-new-tokens", f->sample.max_new_tokens, "tokens to generate (default 64)")
      ->check(non_negative);
  cmd->add_option("--temperature", f->sample.temperature,
                  "sampling temperature, 0 for greedy (default 0.8; below 1e-6 it is greedy in all but name)")
      ->check(CLI::Validator(
          // Logits divided by 1e-45 overflow to infinity, and sampling from
          // them fails inside LibTorch.
          [](std::string& v) {
            const double t = std::strtod(v.c_str(), nullptr);
            return t == 0 || t >= 1e-6 ? "" : "expected 0 (greedy) or at least 1e-6, got " + v;
          },
          "0 or >= 1e-6"));
  cmd->add_option("--top-k", f->sample.top_k, "sample among the k likeliest tokens, 0 for all (default 40)")
      ->check(non_negative);
  cmd->add_option("--top-p", f->sample.top_p,
                  "sample among the likeliest tokens whose probabilities reach p, after top-k (default 1: all)")
      ->check(CLI::Validator(
          [](std::string& v) {
            const double p = std::strtod(v.c_str(), nullptr);
            return p > 0 && p <= 1 ? "" : "expected a probability in (0, 1], got " + v;
          },
          "(0, 1]"));
  cmd->add_option("--stop", f->stop, "end the text once it holds this string (repeatable; kept in the output)");
  cmd->add_flag("--ignore-eos", f->ignore_eos,
                "generate all --max-new-tokens even past the model's end-of-text token (generation_config.json's "
                "eos_token_id)");
  cmd->add_option("--seed", f->sample.seed, "random seed (default 42)");
  cmd->add_option("--tokenizer", f->tokenizer,
                  "directory with tokenizer.json, or encoder.json and vocab.bpe (default: the --from directory's "
                  "tokenizer when it has one, else data/gpt2)");
  cmd->callback([f, &exit_code] {
    FSDP_CHECK(std::filesystem::is_directory(f->from), "--from '", f->from,
               "': no such directory (expected a Hugging Face model directory: config.json + model.safetensors)");
    // A training checkpoint (one step's folder, or the folder of steps with
    // `latest`) is not a model directory yet: say how to make one.
    namespace fs = std::filesystem;
    const fs::path from(f->from);
    if (!fs::exists(from / "config.json") &&
        (fs::exists(from / "metadata.json") || fs::exists(from / "latest") || fs::exists(from / "checkpoints/latest"))) {
      const std::string ckpt = fs::exists(from / "checkpoints/latest") ? (from / "checkpoints").string() : f->from;
      throw Error("--from '" + f->from + "' holds a training checkpoint, not a Hugging Face directory; export it "
                  "first: fsdp ckpt export " + ckpt + " OUT_DIR, then fsdp generate --from OUT_DIR");
    }
    // A LoRA adapter is no model: it runs on its base.
    if (!fs::exists(from / "config.json") && fs::exists(from / "adapter_config.json")) {
      std::string base;
      try {
        base = io::read_json_file((from / "adapter_config.json").string(), "adapter_config.json")
                   .value("base_model_name_or_path", "");
      } catch (const Error&) {
      }
      throw Error("--from '" + f->from + "' is a LoRA adapter (adapter_config.json), not a model: give its base "
                  "model with --from and the adapter with --adapter " + f->from +
                  (base.empty() ? "" : " (the adapter names its base '" + base + "')"));
    }
    const std::string tokenizer_dir =
        !f->tokenizer.empty() ? f->tokenizer : data::has_tokenizer(f->from) ? f->from : data::default_tokenizer_dir();
    const auto tokenizer = data::Tokenizer::from_dir(tokenizer_dir);
    std::fprintf(stderr, "generate: tokenizer %s\n", tokenizer->source().c_str());
    models::CausalLM model{nullptr};
    try {
      model = models::load_hf_pretrained(f->from);
    } catch (const Error& e) {
      throw Error("--from '" + f->from + "': " + e.what());
    }
    if (!f->adapter.empty()) {
      FSDP_CHECK(std::filesystem::is_directory(f->adapter), "--adapter '", f->adapter,
                 "': no such directory (expected a PEFT LoRA adapter: adapter_config.json + adapter_model.safetensors)");
      try {
        models::apply_peft_adapter(*model, f->adapter);
      } catch (const Error& e) {
        throw Error("--adapter '" + f->adapter + "' on --from '" + f->from + "': " + e.what());
      }
      std::fprintf(stderr, "generate: LoRA adapter %s on %s\n", f->adapter.c_str(), f->from.c_str());
    }
    const bool implicit_default = f->tokenizer.empty() && !data::has_tokenizer(f->from);
    check_tokenizer_fits(*tokenizer, model->vocab_size(), f->from, implicit_default);
    std::string prompt_text = f->prompt;
    FSDP_CHECK(f->chat || f->system.empty(), "--system needs --chat (it is a message of the conversation)");
    if (f->chat) {
      // The model directory's template (an export carries it), else the tokenizer's.
      const std::string template_dir = data::chat_template_source(f->from) ? f->from : tokenizer_dir;
      const data::ChatEncoder chat(template_dir, *tokenizer);
      nlohmann::ordered_json messages = nlohmann::ordered_json::array();
      if (!f->system.empty()) messages.push_back({{"role", "system"}, {"content", f->system}});
      messages.push_back({{"role", "user"}, {"content", f->prompt}});
      prompt_text = chat.render(messages, /*add_generation_prompt=*/true);
    }
    auto prompt = tokenizer->encode(prompt_text);
    if (prompt.empty()) prompt.push_back(tokenizer->document_separator());
    for (const int32_t id : prompt) {
      FSDP_CHECK(id < model->vocab_size(), "--prompt encodes to token ", id, ", outside the vocabulary of ",
                 model->vocab_size(), " of the model in '", f->from, "' (tokenizer: ", tokenizer->source(),
                 "; is it the model's?)");
    }
    if (!f->ignore_eos) f->sample.stop_ids = train::end_of_text_ids(f->from);
    if (!f->stop.empty()) {
      f->sample.stop_when = [&](const std::vector<int32_t>& ids) {
        const std::string text = tokenizer->decode_continuation(prompt, ids);
        return std::any_of(f->stop.begin(), f->stop.end(),
                           [&](const std::string& s) { return !s.empty() && text.find(s) != std::string::npos; });
      };
    }
    const int64_t positions = model->max_seq_len();
    if (static_cast<int64_t>(prompt.size()) + f->sample.max_new_tokens > positions) {
      std::fprintf(stderr,
                   "generate: note: the prompt (%zu tokens) and --max-new-tokens %lld exceed the model's %lld "
                   "positions: beyond them each token sees only the last %lld\n",
                   prompt.size(), static_cast<long long>(f->sample.max_new_tokens), static_cast<long long>(positions),
                   static_cast<long long>(positions));
    }
    const auto ids = train::generate(model, prompt, f->sample);
    // fwrite: a byte-fallback token may decode to a NUL byte.
    // With --chat the reply alone: the rendered prompt is the template's markup.
    const std::string text = (f->chat ? "" : f->prompt) + tokenizer->decode_continuation(prompt, ids) + "\n";
    std::fwrite(text.data(), 1, text.size(), stdout);
    exit_code = 0;
  });
}

}  // namespace fsdp::cli
