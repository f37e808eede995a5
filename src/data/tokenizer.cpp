#include "fsdp/data/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <queue>

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>
#include <unicode/utf8.h>

#include "fsdp/common/error.h"
#include "tokenizer_tables.h"
#include "utf8.h"

namespace fsdp::data {
namespace {

// Distinct pieces remembered per Tokenizer; past this, new pieces are
// encoded each time (a corpus has a long tail of rare ones).
constexpr size_t kCacheLimit = 1 << 18;
// Longer pieces are rare repeats (a SentencePiece tokenizer's run of text
// with no word start) and would fill the memory rather than the cache.
constexpr size_t kCachedPieceLimit = 256;

void check_utf8(const std::string& text) {
  // ICU would replace an invalid sequence with U+FFFD and train on text the
  // file does not hold; say where it is instead.
  const int64_t at = first_invalid_utf8(text);
  FSDP_CHECK(at < 0, "the text is not valid UTF-8 at byte ", at, " (byte 0x", std::hex,
             static_cast<int>(static_cast<unsigned char>(text[static_cast<size_t>(at)])), std::dec,
             "); convert it to UTF-8 first (iconv -f ENCODING -t UTF-8)");
}

constexpr int32_t kSplitMatchTimeLimit = 1000;

// Splits every piece at the pattern's matches, keeping matches and the text
// between them as pieces.
std::vector<std::string> split(const std::vector<std::string>& pieces, const icu::RegexPattern& pattern) {
  std::vector<std::string> out;
  UErrorCode status = U_ZERO_ERROR;
  for (const auto& piece : pieces) {
    const icu::UnicodeString text = icu::UnicodeString::fromUTF8(piece);
    std::unique_ptr<icu::RegexMatcher> matcher(pattern.matcher(text, status));
    FSDP_CHECK(U_SUCCESS(status), "tokenizer: ICU matcher failed: ", u_errorName(status));
    // A real split pattern finds each match in microseconds; one from a
    // hostile tokenizer.json can backtrack for hours. ICU's unit is about
    // a millisecond of matching and counts from the matcher's last reset,
    // so each search below starts with find(from), which resets it: the
    // limit is per match, not per document.
    matcher->setTimeLimit(kSplitMatchTimeLimit, status);
    int32_t last = 0, from = 0;
    const auto emit = [&](int32_t begin, int32_t stop) {
      if (begin >= stop) return;
      out.emplace_back();
      text.tempSubStringBetween(begin, stop).toUTF8String(out.back());
    };
    while (U_SUCCESS(status) && matcher->find(from, status) && U_SUCCESS(status)) {
      const int32_t start = matcher->start(status), end = matcher->end(status);
      emit(last, start);
      emit(start, end);
      last = end;
      if (end > start) {
        from = end;
      } else if (end < text.length()) {
        from = text.moveIndex32(end, 1);  // past an empty match, as find() would
      } else {
        break;
      }
    }
    FSDP_CHECK(status != U_REGEX_TIME_OUT && status != U_REGEX_STACK_OVERFLOW,
               "tokenizer: the split pattern gave up on a piece of ", piece.size(), " bytes (", u_errorName(status),
               "); the pattern backtracks without bound, fix the tokenizer.json's pre_tokenizer");
    FSDP_CHECK(U_SUCCESS(status), "tokenizer: ICU matching failed: ", u_errorName(status));
    emit(last, text.length());
  }
  return out;
}

// Byte-pair merging of one piece: from its first symbols (bytes' or
// characters' tokens), merge the adjacent pair of lowest rank (leftmost
// first) until none has a rank. A heap of candidate pairs keeps long pieces
// (a run of 10^5 letters) out of quadratic time; candidates made stale by a
// merge are skipped.
std::vector<int32_t> merge_pairs(const TokenizerTables& t, std::vector<int32_t> id) {
  const auto n = static_cast<int32_t>(id.size());
  std::vector<int32_t> next(static_cast<size_t>(n)), prev(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    next[static_cast<size_t>(i)] = i + 1 < n ? i + 1 : -1;
    prev[static_cast<size_t>(i)] = i - 1;
  }
  struct Candidate {
    int32_t rank, pos, left, right, merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto consider = [&](int32_t pos) {
    const int32_t r = next[static_cast<size_t>(pos)];
    if (r < 0) return;
    const int32_t l_id = id[static_cast<size_t>(pos)], r_id = id[static_cast<size_t>(r)];
    const auto it = t.merges.find(merge_key(l_id, r_id));
    if (it != t.merges.end()) heap.push({it->second.first, pos, l_id, r_id, it->second.second});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const auto pos = static_cast<size_t>(c.pos);
    const int32_t r = next[pos];
    if (id[pos] != c.left || r < 0 || id[static_cast<size_t>(r)] != c.right) continue;  // stale
    id[pos] = c.merged;
    id[static_cast<size_t>(r)] = -1;
    next[pos] = next[static_cast<size_t>(r)];
    if (next[pos] >= 0) prev[static_cast<size_t>(next[pos])] = c.pos;
    if (prev[pos] >= 0) consider(prev[pos]);
    consider(c.pos);
  }
  std::vector<int32_t> out;
  for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = next[static_cast<size_t>(i)]) out.push_back(id[static_cast<size_t>(i)]);
  return out;
}

// Cuts `piece` before each occurrence of `mark` that passes `cut_here`
// (given the occurrence's position), keeping every byte.
template <typename CutHere>
void cut_before(const std::string& piece, const std::string& mark, CutHere cut_here, std::vector<std::string>& out) {
  size_t begin = 0;
  for (size_t at = piece.find(mark, 1); at != std::string::npos; at = piece.find(mark, at + mark.size())) {
    if (!cut_here(at)) continue;
    out.push_back(piece.substr(begin, at - begin));
    begin = at;
  }
  out.push_back(piece.substr(begin));
}

// Hugging Face's Metaspace pre-tokenizer. `first`: the pieces begin the
// text (not after an added token), so pieces[0] is its first piece.
std::vector<std::string> metaspace(std::vector<std::string> pieces, const TokenizerTables::Step& step, bool first) {
  using Prepend = TokenizerTables::Step::Prepend;
  const std::string& mark = step.replacement;
  std::vector<std::string> out;
  for (size_t k = 0; k < pieces.size(); ++k) {
    std::string& p = pieces[k];
    replace_all(p, " ", mark);
    const bool prepend = step.prepend == Prepend::kAlways || (step.prepend == Prepend::kFirst && first && k == 0);
    if (prepend && !p.empty() && p.compare(0, mark.size(), mark) != 0) p.insert(0, mark);
    if (p.empty()) continue;
    if (step.split) {
      cut_before(p, mark, [](size_t) { return true; }, out);  // each mark starts a piece
    } else {
      out.push_back(std::move(p));
    }
  }
  return out;
}

// SentencePiece-style BPE's first symbols: each character's token, else its
// bytes' <0xNN> tokens, else the unknown token, as Hugging Face's
// BPE::merge_word does; and as there, an unknown token waits for the next
// character that has a token (so it follows any byte tokens between) and
// absorbs the unknown ones before it with fuse_unk.
std::vector<int32_t> character_symbols(const TokenizerTables& t, const std::string& piece) {
  std::vector<int32_t> ids;
  bool unk_waiting = false;
  const auto* bytes = reinterpret_cast<const uint8_t*>(piece.data());
  for (int32_t i = 0, n = static_cast<int32_t>(piece.size()); i < n;) {
    const int32_t at = i;
    UChar32 c;
    U8_NEXT(bytes, i, n, c);
    const auto known = t.char_token.find(c);
    if (known != t.char_token.end()) {
      if (unk_waiting) ids.push_back(t.unk);
      unk_waiting = false;
      ids.push_back(known->second);
      continue;
    }
    const auto has_token = [&](uint8_t b) { return t.byte_fallback_token[b] >= 0; };
    if (t.byte_fallback && std::all_of(bytes + at, bytes + i, has_token)) {
      for (int32_t k = at; k < i; ++k) ids.push_back(t.byte_fallback_token[bytes[k]]);
      continue;
    }
    if (t.unk < 0) continue;  // dropped, as Hugging Face does without an unk_token
    if (unk_waiting && !t.fuse_unk) ids.push_back(t.unk);
    unk_waiting = true;
  }
  if (unk_waiting) ids.push_back(t.unk);
  return ids;
}

}  // namespace

Tokenizer::Tokenizer(std::shared_ptr<const TokenizerTables> tables) : tables_(std::move(tables)) {}
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::clone() const { return std::make_unique<Tokenizer>(tables_); }

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(tables_->bytes_of.size()); }

const std::string& Tokenizer::source() const { return tables_->source; }

bool Tokenizer::is_special(int32_t id) const {
  return std::any_of(tables_->added.begin(), tables_->added.end(),
                     [&](const TokenizerTables::AddedToken& a) { return a.id == id && a.special; });
}

const std::vector<int32_t>& Tokenizer::template_prefix() const { return tables_->template_prefix; }

const std::map<std::string, std::string>& Tokenizer::special_tokens() const { return tables_->special_tokens; }

int32_t Tokenizer::document_separator() const {
  FSDP_CHECK(tables_->separator >= 0, tables_->source,
             ": no token separates documents: the tokenizer has no <|endoftext|> and no tokenizer_config.json ",
             "naming a bos_token or eos_token");
  return tables_->separator;
}

std::vector<int32_t> Tokenizer::encode_piece(const std::string& piece) const {
  const auto cached = cache_.find(piece);
  if (cached != cache_.end()) return cached->second;
  const auto& t = *tables_;
  std::vector<int32_t> ids;
  if (t.ignore_merges) {
    std::string spelled;
    if (t.byte_level) {
      for (const unsigned char b : piece) spelled += byte_level_alphabet()[b];
    }
    const auto it = t.vocab.find(t.byte_level ? spelled : piece);
    if (it != t.vocab.end()) ids = {it->second};
  }
  if (ids.empty()) {
    std::vector<int32_t> symbols;
    if (t.byte_level) {
      symbols.reserve(piece.size());
      for (const unsigned char b : piece) symbols.push_back(t.byte_token[b]);
    } else {
      symbols = character_symbols(t, piece);
    }
    ids = merge_pairs(t, std::move(symbols));
  }
  if (cache_.size() < kCacheLimit && piece.size() <= kCachedPieceLimit) cache_.emplace(piece, ids);
  return ids;
}

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  FSDP_CHECK(text.size() <= static_cast<size_t>(INT32_MAX), "the text is over 2 GiB; split it into documents");
  check_utf8(text);
  const auto& t = *tables_;
  std::vector<int32_t> ids;
  const auto encode_text = [&](size_t from, size_t to) {
    if (from >= to) return;
    std::string normal = text.substr(from, to - from);
    using Normalizer = TokenizerTables::Normalizer;
    for (const auto& n : t.normalizers) {
      if (n.kind == Normalizer::Kind::kNfc) {
        UErrorCode status = U_ZERO_ERROR;
        const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
        FSDP_CHECK(U_SUCCESS(status), "tokenizer: ICU has no NFC normaliser: ", u_errorName(status));
        const icu::UnicodeString composed = nfc->normalize(icu::UnicodeString::fromUTF8(normal), status);
        FSDP_CHECK(U_SUCCESS(status), "tokenizer: NFC normalisation failed: ", u_errorName(status));
        normal.clear();
        composed.toUTF8String(normal);
      } else if (n.kind == Normalizer::Kind::kPrepend) {
        if (!normal.empty()) normal.insert(0, n.text);
      } else {
        replace_all(normal, n.text, n.replacement);
      }
    }
    std::vector<std::string> pieces{std::move(normal)};
    using Kind = TokenizerTables::Step::Kind;
    for (const auto& step : t.steps) {
      if (step.kind == Kind::kSplit) {
        pieces = split(pieces, *step.pattern);
      } else if (step.kind == Kind::kMetaspace) {
        pieces = metaspace(std::move(pieces), step, from == 0);
      } else {
        for (auto& p : pieces) {
          if (p.empty() || p[0] != ' ') p.insert(0, 1, ' ');
        }
      }
    }
    if (!t.word_start.empty()) {
      // [Note: cutting SentencePiece text into words]
      std::vector<std::string> words;
      const std::string& mark = t.word_start;
      for (const auto& p : pieces) {
        const auto after_another = [&](size_t at) {
          return at < mark.size() || p.compare(at - mark.size(), mark.size(), mark) != 0;
        };
        cut_before(p, mark, after_another, words);
      }
      pieces = std::move(words);
    }
    for (const auto& piece : pieces) {
      const auto piece_ids = encode_piece(piece);
      ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
    }
  };
  // Added tokens are cut out first, leftmost and then longest first, as
  // Hugging Face does; the text between them is encoded.
  size_t start = 0;
  for (size_t i = 0; i < text.size() && !t.added.empty(); ++i) {
    for (const size_t k : t.added_by_first_byte[static_cast<unsigned char>(text[i])]) {
      const auto& a = t.added[k];
      if (text.compare(i, a.content.size(), a.content) != 0) continue;
      encode_text(start, i);
      ids.push_back(a.id);
      start = i + a.content.size();
      i = start - 1;
      break;
    }
  }
  encode_text(start, text.size());
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const { return decode_tokens(ids, false); }

std::string Tokenizer::decode_continuation(const std::vector<int32_t>& prompt, const std::vector<int32_t>& ids) const {
  const auto& t = *tables_;
  // Text after an added token starts anew, as encoding has it (a
  // SentencePiece normaliser prepends "▁" to each run of text).
  const auto is_last = [&](const TokenizerTables::AddedToken& a) { return a.id == prompt.back(); };
  const bool after_text = !prompt.empty() && std::none_of(t.added.begin(), t.added.end(), is_last);
  return decode_tokens(ids, after_text);
}

std::string Tokenizer::decode_tokens(const std::vector<int32_t>& ids, bool after_text) const {
  const auto& t = *tables_;
  std::vector<std::string> tokens;
  // A stand-in for the text before, which no decoder changes: the decoders
  // that treat the start of a text specially (Strip, Metaspace) see that
  // the continuation does not start it. Byte-level decoding has no such
  // decoders.
  const std::string before = "\x01";
  const bool marked = after_text && !t.decoders.empty();
  if (marked) tokens.push_back(before);
  for (const int32_t id : ids) {
    FSDP_CHECK(id >= 0, "token id ", id, " is negative");
    // Models pad their vocabulary past the tokenizer's (Qwen3: 151,936
    // rows, 151,669 tokens); an id with no token decodes to nothing, as in
    // Hugging Face's decode.
    if (id < vocab_size() && !t.bytes_of[static_cast<size_t>(id)].empty()) {
      tokens.push_back(t.bytes_of[static_cast<size_t>(id)]);
    }
  }
  std::string text = run_decoders(t.decoders, std::move(tokens));
  if (marked && text.compare(0, before.size(), before) == 0) text.erase(0, before.size());
  return text;
}

std::optional<std::pair<std::string, std::string>> gpt2_bpe_files(const std::string& dir) {
  namespace fs = std::filesystem;
  for (const auto& [vocab, merges] : {std::pair{"encoder.json", "vocab.bpe"}, std::pair{"vocab.json", "merges.txt"}}) {
    const auto v = fs::path(dir) / vocab, m = fs::path(dir) / merges;
    if (fs::is_regular_file(v) && fs::is_regular_file(m)) return std::pair{v.string(), m.string()};
  }
  return std::nullopt;
}

bool has_tokenizer(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path json = fs::path(dir) / "tokenizer.json";
  std::error_code ec;
  const auto status = fs::status(json, ec);
  // Passed over, a FIFO or a folder named tokenizer.json would have GPT-2's
  // tokenizer stand in for the directory's own without a word.
  FSDP_CHECK(!fs::exists(status) || fs::is_regular_file(status), "'", json.string(),
             "' is not a regular file (a FIFO or a directory?); expected a tokenizer.json");
  return fs::is_regular_file(status) || gpt2_bpe_files(dir).has_value();
}

std::string default_tokenizer_dir() {
  namespace fs = std::filesystem;
  const std::string here = "data/gpt2";
  if (has_tokenizer(here)) return here;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return here;
  // build/fsdp, or build/tests/<binary>: the repository is one or two up.
  for (fs::path dir = exe.parent_path(); !dir.empty() && dir != dir.root_path(); dir = dir.parent_path()) {
    const fs::path candidate = dir / "data" / "gpt2";
    if (has_tokenizer(candidate.string())) return candidate.string();
    if (dir == exe.parent_path().parent_path().parent_path()) break;
  }
  return here;
}

std::unique_ptr<Tokenizer> Tokenizer::from_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path d(dir);
  if (has_tokenizer(dir) && fs::is_regular_file(d / "tokenizer.json")) {
    const auto config = d / "tokenizer_config.json";
    return from_tokenizer_json((d / "tokenizer.json").string(), fs::exists(config) ? config.string() : "");
  }
  const auto bpe = gpt2_bpe_files(dir);
  FSDP_CHECK(bpe.has_value(), "--tokenizer '", dir,
             "' holds neither a tokenizer.json (a Hugging Face model directory) nor GPT-2's encoder.json and ",
             "vocab.bpe, or vocab.json and merges.txt (scripts/fetch_data.sh downloads GPT-2's to data/gpt2)");
  return from_gpt2_files(bpe->first, bpe->second);
}

}  // namespace fsdp::data
