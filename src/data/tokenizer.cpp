#include "fsdp/data/tokenizer.h"

#include <filesystem>
#include <queue>

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>
#include <unicode/utf8.h>

#include "fsdp/common/error.h"
#include "tokenizer_tables.h"

namespace fsdp::data {
namespace {

// Distinct pieces remembered per Tokenizer; past this, new pieces are
// encoded each time (a corpus has a long tail of rare ones).
constexpr size_t kCacheLimit = 1 << 18;

void check_utf8(const std::string& text) {
  // ICU would replace an invalid sequence with U+FFFD and train on text the
  // file does not hold; say where it is instead.
  for (int32_t i = 0, n = static_cast<int32_t>(text.size()); i < n;) {
    const int32_t at = i;
    UChar32 c;
    U8_NEXT(reinterpret_cast<const uint8_t*>(text.data()), i, n, c);
    FSDP_CHECK(c >= 0, "the text is not valid UTF-8 at byte ", at, " (byte 0x", std::hex,
               static_cast<int>(static_cast<unsigned char>(text[static_cast<size_t>(at)])), std::dec,
               "); convert it to UTF-8 first (iconv -f ENCODING -t UTF-8)");
  }
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

// Byte-pair merging of one piece: start from its bytes' tokens, then merge
// the adjacent pair of lowest rank (leftmost first) until none has a rank.
// A heap of candidate pairs keeps long pieces (a run of 10^5 letters) out
// of quadratic time; candidates made stale by a merge are skipped.
std::vector<int32_t> merge_pairs(const TokenizerTables& t, const std::string& piece) {
  const auto n = static_cast<int32_t>(piece.size());
  std::vector<int32_t> id(static_cast<size_t>(n)), next(static_cast<size_t>(n)), prev(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    id[static_cast<size_t>(i)] = t.byte_token[static_cast<unsigned char>(piece[static_cast<size_t>(i)])];
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

}  // namespace

Tokenizer::Tokenizer(std::shared_ptr<const TokenizerTables> tables) : tables_(std::move(tables)) {}
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::clone() const { return std::make_unique<Tokenizer>(tables_); }

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(tables_->bytes_of.size()); }

const std::string& Tokenizer::source() const { return tables_->source; }

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
    for (const unsigned char b : piece) spelled += byte_level_alphabet()[b];
    const auto it = t.vocab.find(spelled);
    if (it != t.vocab.end()) ids = {it->second};
  }
  if (ids.empty()) ids = merge_pairs(t, piece);
  if (cache_.size() < kCacheLimit) cache_.emplace(piece, ids);
  return ids;
}

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  FSDP_CHECK(text.size() <= static_cast<size_t>(INT32_MAX), "the text is over 2 GiB; split it into documents");
  check_utf8(text);
  const auto& t = *tables_;
  std::vector<int32_t> ids;
  const auto encode_text = [&](size_t from, size_t to) {
    if (from >= to) return;
    std::vector<std::string> pieces{text.substr(from, to - from)};
    if (t.nfc) {
      UErrorCode status = U_ZERO_ERROR;
      const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
      FSDP_CHECK(U_SUCCESS(status), "tokenizer: ICU has no NFC normaliser: ", u_errorName(status));
      const icu::UnicodeString normal = nfc->normalize(icu::UnicodeString::fromUTF8(pieces[0]), status);
      FSDP_CHECK(U_SUCCESS(status), "tokenizer: NFC normalisation failed: ", u_errorName(status));
      pieces[0].clear();
      normal.toUTF8String(pieces[0]);
    }
    for (const auto& step : t.steps) {
      if (step.kind == TokenizerTables::Step::Kind::kSplit) {
        pieces = split(pieces, *step.pattern);
      } else {
        for (auto& p : pieces) {
          if (p.empty() || p[0] != ' ') p.insert(0, 1, ' ');
        }
      }
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

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (const int32_t id : ids) {
    FSDP_CHECK(id >= 0, "token id ", id, " is negative");
    // Models pad their vocabulary past the tokenizer's (Qwen3: 151,936
    // rows, 151,669 tokens); an id with no token decodes to nothing, as in
    // Hugging Face's decode.
    if (id < vocab_size()) text += tables_->bytes_of[static_cast<size_t>(id)];
  }
  return text;
}

bool has_tokenizer(const std::string& dir) {
  namespace fs = std::filesystem;
  return fs::is_regular_file(fs::path(dir) / "tokenizer.json") ||
         (fs::is_regular_file(fs::path(dir) / "encoder.json") && fs::is_regular_file(fs::path(dir) / "vocab.bpe"));
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
  if (fs::is_regular_file(d / "tokenizer.json")) {
    const auto config = d / "tokenizer_config.json";
    return from_tokenizer_json((d / "tokenizer.json").string(), fs::exists(config) ? config.string() : "");
  }
  FSDP_CHECK(has_tokenizer(dir), "--tokenizer '", dir,
             "' holds neither a tokenizer.json (a Hugging Face model directory) nor GPT-2's encoder.json and ",
             "vocab.bpe (scripts/fetch_data.sh downloads GPT-2's to data/gpt2)");
  return from_gpt2_files((d / "encoder.json").string(), (d / "vocab.bpe").string());
}

}  // namespace fsdp::data
