// `fsdp data prepare` (and `fsdp data encode` and `decode` for checking the
// tokenizer).

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>

#include "commands.h"
#include "fsdp/common/error.h"
#include "fsdp/common/error_text.h"
#include "fsdp/data/chat_data.h"
#include "fsdp/data/prepare.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/io/input_file.h"
#include "python_tools.h"

namespace fsdp::cli {
namespace {

// A separator typed on a command line: \n, \t and \\ as in C.
std::string unescape(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\' || i + 1 == text.size()) {
      out += text[i];
      continue;
    }
    const char next = text[++i];
    out += next == 'n' ? '\n' : next == 't' ? '\t' : next == 'r' ? '\r' : next;
  }
  return out;
}

constexpr const char* kTokenizerHelp =
    "directory with a Hugging Face tokenizer.json (a model directory), or GPT-2's encoder.json and vocab.bpe";

}  // namespace

void add_data_command(CLI::App& app, int& exit_code) {
  auto* data = app.add_subcommand("data", "prepare token files");
  data->require_subcommand(1);

  auto options = std::make_shared<data::PrepareOptions>();
  options->tokenizer_dir = data::default_tokenizer_dir();
  auto* prepare = data->add_subcommand("prepare", "tokenize raw text into train.bin and val.bin (llm.c format)");
  prepare->add_option("--input", options->inputs,
                      "a .txt/.json/.jsonl file ({\"text\": ...} per line), a .parquet file (a Hugging Face "
                      "dataset's), a directory of them, or a quoted glob ('shards/*.parquet'); chat data: .jsonl "
                      "lines of {\"messages\": [...]} or {\"prompt\": ..., \"completion\": ...}, rendered with "
                      "--tokenizer's chat template, the loss on the answers. Give it more than once (or several "
                      "after it) for one corpus of them all, in the order given")
      ->required()
      ->expected(1, -1);
  prepare->add_option("--text-field", options->text_field,
                      "the field of a .json file or .jsonl line, or the column of a .parquet file, holding the text")
      ->capture_default_str();
  auto separator = std::make_shared<std::string>();
  auto* separator_option = prepare->add_option(
      "--doc-separator", *separator,
      "what ends a document inside a .txt file: default, blank lines; '' each file is one document; else this "
      "text (\\n for a newline)");
  prepare->add_option("--out-dir", options->out_dir, "where train.bin and val.bin (or their shards) go")->required();
  prepare->add_option("--tokenizer", options->tokenizer_dir, kTokenizerHelp)->capture_default_str();
  auto* val_fraction = prepare->add_option("--val-fraction", options->val_fraction,
                                           "share of documents held out; 0: no val split")
                           ->capture_default_str();
  prepare->add_flag("--as-validation", options->validation_only,
                    "every document to val.bin: a validation set prepared apart (for --val-data), no train.bin")
      ->excludes(val_fraction);
  prepare->add_option("--shard-tokens", options->shard_tokens,
                      "split into train_000000.bin, ... of at most this many tokens (0: one file per split)")
      ->capture_default_str();
  prepare->add_option("--threads", options->threads, "tokenizer threads (0: every core)")->capture_default_str();
  prepare->callback([options, separator, separator_option, &exit_code] {
    if (separator_option->count() > 0) options->txt_separator = unescape(*separator);
    // Parquet through Apache Arrow's reader (tools/parquet_text.py), under
    // FSDP_PYTHON or the venv this build was configured beside.
    options->parquet_reader = {tool_python(), tool_script("parquet_text.py")};
    const auto s = data::prepare_corpus(*options);
    if (s.split_txt) {
      std::printf("data prepare: .txt files were split into documents at %s (--doc-separator)\n",
                  options->txt_separator ? "each separator" : "blank lines");
    }
    std::printf("data prepare: %lld %s, %s of text -> %lld train tokens (%d file%s) + %lld val tokens (%d file%s) in %s\n",
                static_cast<long long>(s.documents), s.preference_pairs ? "preference pairs (chosen and rejected examples)" : s.examples ? "chat examples" : "documents",
                data::human_bytes(s.bytes).c_str(),
                static_cast<long long>(s.train_tokens), s.train_files, s.train_files == 1 ? "" : "s",
                static_cast<long long>(s.val_tokens), s.val_files, s.val_files == 1 ? "" : "s", options->out_dir.c_str());
    if (s.examples) {
      std::printf("data prepare: tokenizer and chat template %s; the loss covers %lld of %lld tokens (the answers; "
                  "masks in .mask files beside the token files); the longest example has %lld tokens\n",
                  s.tokenizer.c_str(), static_cast<long long>(s.trained_tokens),
                  static_cast<long long>(s.train_tokens + s.val_tokens), static_cast<long long>(s.longest_example));
      if (s.answers_left_out > 0) {
        std::printf("data prepare: note: %lld assistant message%s left out of the loss: the chat template renders "
                    "what precedes %s differently when the model generates %s (Mistral's tools go before the last "
                    "user message only)\n",
                    static_cast<long long>(s.answers_left_out), s.answers_left_out == 1 ? " is" : "s are",
                    s.answers_left_out == 1 ? "it" : "them", s.answers_left_out == 1 ? "it" : "them");
      }
    } else {
      std::printf("data prepare: tokenizer %s; documents start with token %d\n", s.tokenizer.c_str(), s.separator);
    }
    if (!s.note.empty()) std::printf("data prepare: %s\n", s.note.c_str());
    if (!s.removed.empty()) {
      std::string names;
      for (const auto& name : s.removed) names += (names.empty() ? "" : ", ") + name;
      std::printf("data prepare: removed %zu token file%s an earlier prepare had left in %s: %s\n", s.removed.size(),
                  s.removed.size() == 1 ? "" : "s", options->out_dir.c_str(), names.c_str());
    }
    exit_code = 0;
  });

  auto tokenizer_dir = std::make_shared<std::string>(data::default_tokenizer_dir());
  auto* encode = data->add_subcommand("encode", "print the token ids of standard input, one line");
  encode->add_option("--tokenizer", *tokenizer_dir, kTokenizerHelp)->capture_default_str();
  auto chat = std::make_shared<bool>(false), generation_prompt = std::make_shared<bool>(false),
       render = std::make_shared<bool>(false);
  encode->add_flag("--chat", *chat,
                   "standard input is one conversation ({\"messages\": [...]}, or the list itself): its ids under "
                   "--tokenizer's chat template, as apply_chat_template(tokenize=True)");
  encode->add_flag("--add-generation-prompt", *generation_prompt, "with --chat: end with the assistant's turn opened");
  auto* render_flag =
      encode->add_flag("--render", *render, "with --chat: print the rendered text instead of its ids");
  auto each_line = std::make_shared<bool>(false);
  encode
      ->add_flag("--each-line", *each_line,
                 "standard input is JSON Lines (with --chat) or lines of text: one output line per input line, "
                 "'error: ...' for one that is refused (then exit 1 after the last)")
      ->excludes(render_flag);
  encode->callback([tokenizer_dir, chat, generation_prompt, render, each_line, &exit_code] {
    const auto tokenizer = data::Tokenizer::from_dir(*tokenizer_dir);
    std::optional<data::ChatEncoder> encoder;
    if (*chat) encoder.emplace(*tokenizer_dir, *tokenizer);
    // One conversation (or text) to the line it prints, without its newline.
    auto encode_one = [&](std::string text, const std::string& where) {
      if (*chat) {
        nlohmann::ordered_json record = io::parse_ordered_json(text, "data encode --chat: " + where);
        if (record.is_array()) record = {{"messages", record}};
        FSDP_CHECK(record.is_object() && record.contains("messages"), "data encode --chat: expected {\"messages\": ",
                   "[...]} or a list of messages on ", where);
        text = encoder->render(record["messages"], *generation_prompt,
                               record.value("chat_template_kwargs", nlohmann::ordered_json::object()));
        if (*render) return text;
      }
      std::string line;
      for (const int32_t id : tokenizer->encode(text)) line += (line.empty() ? "" : ",") + std::to_string(id);
      return line;
    };
    if (!*each_line) {
      std::stringstream in;
      in << std::cin.rdbuf();
      const auto out = encode_one(in.str(), "standard input");
      std::fwrite(out.data(), 1, out.size(), stdout);
      if (!(*chat && *render)) std::printf("\n");  // a rendering is printed as it is
      exit_code = 0;
      return;
    }
    // A file of conversations checked in one start (the tokenizer loads
    // once): a refused line says why on its own output line, and the rest
    // are still encoded.
    int refused = 0;
    int64_t number = 0;
    for (std::string line; std::getline(std::cin, line);) {
      ++number;
      try {
        std::printf("%s\n", encode_one(line, "line " + std::to_string(number)).c_str());
      } catch (const std::exception& e) {
        std::string why = error_text(e);
        for (auto& c : why) c = c == '\n' || c == '\r' ? ' ' : c;
        std::printf("error: %s\n", why.c_str());
        ++refused;
      }
    }
    std::fflush(stdout);
    if (refused) std::fprintf(stderr, "data encode: %d of %lld line(s) refused (their lines say why)\n", refused,
                              static_cast<long long>(number));
    exit_code = refused ? 1 : 0;
  });

  auto decode_dir = std::make_shared<std::string>(data::default_tokenizer_dir());
  auto* decode = data->add_subcommand("decode", "print the text of the token ids on standard input, one line");
  decode->add_option("--tokenizer", *decode_dir, kTokenizerHelp)->capture_default_str();
  decode->callback([decode_dir, &exit_code] {
    const auto tokenizer = data::Tokenizer::from_dir(*decode_dir);
    std::stringstream in;
    in << std::cin.rdbuf();
    std::string list = in.str();
    for (auto& c : list) c = c == ',' ? ' ' : c;  // data encode's commas, or spaces
    std::istringstream words(list);
    std::vector<int32_t> ids;
    for (std::string word; words >> word;) {
      FSDP_CHECK(word.size() <= 9 && word.find_first_not_of("0123456789") == std::string::npos, "data decode: '",
                 word, "' on standard input is not a token id (expected ids separated by commas or spaces)");
      ids.push_back(std::stoi(word));
    }
    const auto text = tokenizer->decode(ids);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::printf("\n");
    exit_code = 0;
  });
}

}  // namespace fsdp::cli
