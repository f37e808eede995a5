// Hugging Face's decoders for SentencePiece-style tokenizers, each over the
// list of token strings as `tokenizers` runs them (decode_chain), so that a
// sequence of them gives the same text: Replace, ByteFallback, Fuse, Strip,
// Metaspace.


#include "tokenizer_tables.h"
#include "utf8.h"

namespace fsdp::data {
namespace {

using Decoder = TokenizerTables::Decoder;

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The byte a "<0xNN>" token stands for, or -1.
int byte_token(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  const int high = hex_digit(token[3]), low = hex_digit(token[4]);
  return high < 0 || low < 0 ? -1 : high * 16 + low;
}

// Each run of byte tokens becomes one token of its bytes when they are
// UTF-8, else one U+FFFD per byte.
std::vector<std::string> byte_fallback(std::vector<std::string> tokens) {
  std::vector<std::string> out;
  std::string run;
  size_t run_length = 0;
  const auto flush = [&] {
    if (run_length == 0) return;
    if (first_invalid_utf8(run) < 0) {
      out.push_back(run);
    } else {
      for (size_t k = 0; k < run_length; ++k) out.emplace_back("\xef\xbf\xbd");
    }
    run.clear();
    run_length = 0;
  };
  for (auto& token : tokens) {
    const int byte = byte_token(token);
    if (byte >= 0) {
      run += static_cast<char>(byte);
      ++run_length;
      continue;
    }
    flush();
    out.push_back(std::move(token));
  }
  flush();
  return out;
}

// The length of the UTF-8 character that starts at s[i].
size_t char_length(const std::string& s, size_t i) { return utf8_length(static_cast<unsigned char>(s[i])); }

// At most `start` leading and `stop` trailing copies of the character `c`.
void strip(std::string& token, const std::string& c, size_t start, size_t stop) {
  size_t begin = 0, end = token.size();
  for (size_t k = 0; k < start && begin < end && token.compare(begin, c.size(), c) == 0; ++k) begin += c.size();
  for (size_t k = 0; k < stop && end - begin >= c.size() && token.compare(end - c.size(), c.size(), c) == 0; ++k) {
    end -= c.size();
  }
  token = token.substr(begin, end - begin);
}

// Replacement characters become spaces, except in the first token, where
// (unless nothing was prepended) they are dropped.
void metaspace(std::vector<std::string>& tokens, const Decoder& d) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::string out;
    const std::string& token = tokens[i];
    for (size_t at = 0; at < token.size();) {
      const size_t len = char_length(token, at);
      if (token.compare(at, len, d.text) != 0) {
        out.append(token, at, len);
      } else if (i != 0 || !d.prepend) {
        out += ' ';
      }
      at += len;
    }
    tokens[i] = std::move(out);
  }
}

}  // namespace

std::string run_decoders(const std::vector<Decoder>& decoders, std::vector<std::string> tokens) {
  for (const auto& d : decoders) {
    switch (d.kind) {
      case Decoder::Kind::kReplace:
        for (auto& token : tokens) replace_all(token, d.text, d.replacement);
        break;
      case Decoder::Kind::kByteFallback:
        tokens = byte_fallback(std::move(tokens));
        break;
      case Decoder::Kind::kFuse: {
        std::string all;
        for (const auto& token : tokens) all += token;
        tokens = {std::move(all)};
        break;
      }
      case Decoder::Kind::kStrip:
        for (auto& token : tokens) strip(token, d.text, d.start, d.stop);
        break;
      case Decoder::Kind::kMetaspace:
        metaspace(tokens, d);
        break;
    }
  }
  std::string text;
  for (const auto& token : tokens) text += token;
  return text;
}

}  // namespace fsdp::data
