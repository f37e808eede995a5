#include "fsdp/data/prepare.h"

#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"
#include "fsdp/data/chat_data.h"
#include "fsdp/data/loss_mask.h"
#include "fsdp/io/input_file.h"
#include "fsdp/data/token_file.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/data/tokenizer_record.h"

namespace fsdp::data {
namespace {

namespace fs = std::filesystem;

std::string text_field(const std::string& json, const std::string& field, const std::string& where) {
  try {
    const auto j = io::parse_json(json, where);
    if (!(j.is_object() && j.contains(field) && j[field].is_string())) {
      std::string fields;
      if (j.is_object()) {
        for (const auto& [key, value] : j.items()) {
          if (value.is_string()) fields += (fields.empty() ? "" : ", ") + ("\"" + key + "\"");
        }
      }
      throw Error(where + " has no string field \"" + field + "\"" +
                  (fields.empty() ? "" : " (its string fields: " + fields + "; --text-field chooses one)"));
    }
    return j[field].get<std::string>();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(where + " is not valid JSON (" + e.what() + ")");
  }
}

bool blank(const std::string& line) { return line.find_first_not_of(" \t\r\f\v") == std::string::npos; }

// A .txt file's documents: its paragraphs (runs of lines between blank
// ones), or its parts between occurrences of `separator`, or all of it.
std::vector<std::string> split_txt(const std::string& text, const std::optional<std::string>& separator) {
  std::vector<std::string> docs;
  if (separator && separator->empty()) {
    docs.push_back(text);
  } else if (separator) {
    for (size_t start = 0;;) {
      const size_t at = text.find(*separator, start);
      const std::string part = text.substr(start, at == std::string::npos ? std::string::npos : at - start);
      if (!blank(part)) docs.push_back(part);
      if (at == std::string::npos) break;
      start = at + separator->size();
    }
  } else {
    std::istringstream lines(text);
    std::string line, doc;
    while (std::getline(lines, line)) {
      if (blank(line)) {
        if (!doc.empty()) docs.push_back(std::move(doc));
        doc.clear();
      } else {
        doc += (doc.empty() ? "" : "\n") + line;
      }
    }
    if (!doc.empty()) docs.push_back(std::move(doc));
  }
  return docs;
}

std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Parquet, or Arrow (a `datasets` save_to_disk folder's files): both read
// through the columnar reader, tools/parquet_text.py.
bool is_columnar(const fs::path& p) { return p.extension() == ".parquet" || p.extension() == ".arrow"; }

// A Parquet file through the reader command: its stdout's lines, one JSON
// value each (a document's string for a text column FIELD; a chat record
// for "--records"), each passed to `take` with its row; its stderr, why it
// failed, kept for the message.
void read_parquet(const fs::path& path, const PrepareOptions& o, const std::string& field,
                  const std::function<void(const std::string&, int64_t)>& take) {
  FSDP_CHECK(!o.parquet_reader.empty(), "'", path.string(), "': Parquet files need the reader of `fsdp data prepare`");
  char errors_path[] = "/tmp/fsdp-parquet-XXXXXX";
  const int errors_fd = ::mkstemp(errors_path);
  FSDP_CHECK(errors_fd >= 0, "cannot make a temporary file: ", std::strerror(errno));
  ::close(errors_fd);
  std::string command;
  for (const auto& part : o.parquet_reader) command += shell_quoted(part) + " ";
  command += shell_quoted(path.string()) + " " + shell_quoted(field) + " 2>" + shell_quoted(errors_path);
  std::FILE* pipe = ::popen(command.c_str(), "r");
  FSDP_CHECK(pipe != nullptr, "cannot run the Parquet reader '", o.parquet_reader.front(), "': ", std::strerror(errno));
  std::string line;
  char buf[1 << 16];
  int64_t n = 0;
  std::string failure;
  while (std::fgets(buf, sizeof(buf), pipe) != nullptr) {
    line += buf;
    if (line.empty() || line.back() != '\n') continue;
    ++n;
    try {
      if (failure.empty()) take(line, n);
    } catch (const std::exception& e) {
      failure = "row " + std::to_string(n) + " came back as no JSON " +
                (field.rfind("--", 0) == 0 ? "record" : "string") + " (" + e.what() + ")";
    }
    line.clear();
  }
  const int status = ::pclose(pipe);
  std::string errors = io::read_file(errors_path, "the Parquet reader's errors");
  ::unlink(errors_path);
  while (!errors.empty() && (errors.back() == '\n' || errors.back() == ' ')) errors.pop_back();
  if (const auto last = errors.rfind('\n'); last != std::string::npos) errors = errors.substr(last + 1);
  if (errors.rfind("error: ", 0) == 0) errors = errors.substr(7);
  FSDP_CHECK(status == 0, errors.empty() ? "'" + path.string() + "': the Parquet reader (" + o.parquet_reader.back() +
                                               ") failed with status " + std::to_string(status)
                                         : errors);
  FSDP_CHECK(failure.empty(), "'", path.string(), "': ", failure);
}

std::vector<std::string> parquet_documents(const fs::path& path, const PrepareOptions& o) {
  std::vector<std::string> docs;
  read_parquet(path, o, o.text_field, [&](const std::string& line, int64_t) {
    const auto value = nlohmann::json::parse(line);
    if (value.is_string()) docs.push_back(value.get<std::string>());
  });
  return docs;
}

// Every document of one file, in order.
std::vector<std::string> documents_of(const fs::path& path, const PrepareOptions& o) {
  // Every reader, the Parquet one too: opening a FIFO would block for good.
  io::check_regular_file(path.string(), "input of `data prepare`");
  if (is_columnar(path)) return parquet_documents(path, o);
  std::ifstream in(path, std::ios::binary);
  FSDP_CHECK(in.good(), "cannot read '", path.string(), "'");
  if (path.extension() == ".jsonl") {
    std::vector<std::string> docs;
    std::string line;
    int64_t n = 0;
    while (std::getline(in, line)) {
      ++n;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      docs.push_back(text_field(line, o.text_field, "'" + path.string() + "' line " + std::to_string(n)));
    }
    return docs;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (path.extension() == ".json") return {text_field(ss.str(), o.text_field, "'" + path.string() + "'")};
  return split_txt(ss.str(), o.txt_separator);
}

// A .jsonl file's records (a .json file's one), in order, each with where
// it is for messages; blank lines are skipped. Keys keep their order: a
// template writes a tool's arguments as given.
struct Record {
  nlohmann::ordered_json value;
  std::string where;
  int64_t bytes;
};

std::vector<Record> records_of(const fs::path& path, const PrepareOptions& o) {
  io::check_regular_file(path.string(), "input of `data prepare`");
  FSDP_CHECK(path.extension() == ".jsonl" || path.extension() == ".json" || is_columnar(path), "'",
             path.string(), "': chat data is read from .jsonl (one record a line), .json, .parquet and .arrow files; "
             "expected one of those beside the other chat data");
  if (is_columnar(path)) {
    std::vector<Record> rows;
    read_parquet(path, o, "--records", [&](const std::string& line, int64_t row) {
      const std::string where = "'" + path.string() + "' row " + std::to_string(row);
      rows.push_back({io::parse_ordered_json(line, where), where, static_cast<int64_t>(line.size())});
    });
    return rows;
  }
  std::ifstream in(path, std::ios::binary);
  FSDP_CHECK(in.good(), "cannot read '", path.string(), "'");
  std::vector<Record> out;
  std::string line;
  int64_t n = 0;
  const auto parse = [&](const std::string& text, const std::string& where) {
    out.push_back({io::parse_ordered_json(text, where), where, static_cast<int64_t>(text.size())});
  };
  if (path.extension() == ".json") {
    std::stringstream ss;
    ss << in.rdbuf();
    parse(ss.str(), "'" + path.string() + "'");
    return out;
  }
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    parse(line, "'" + path.string() + "' line " + std::to_string(n));
  }
  return out;
}

// Whether the corpus is chat data: its first .jsonl or .json file's first
// record is a conversation or a prompt and completion, or its first
// .parquet file has such columns.
bool holds_chat_data(const std::vector<fs::path>& files, const PrepareOptions& o) {
  for (const auto& f : files) {
    if (is_columnar(f)) {
      io::check_regular_file(f.string(), "input of `data prepare`");
      bool chat = false;
      read_parquet(f, o, "--is-chat", [&](const std::string& line, int64_t) { chat = line.rfind("true", 0) == 0; });
      return chat;
    }
    if (f.extension() != ".jsonl" && f.extension() != ".json") continue;
    // Opening a FIFO would block for good: refused first, naming it.
    io::check_regular_file(f.string(), "input of `data prepare`");
    std::ifstream in(f, std::ios::binary);
    std::string line;
    if (f.extension() == ".json") {
      std::stringstream ss;
      ss << in.rdbuf();
      line = ss.str();
    } else {
      while (std::getline(in, line) && line.find_first_not_of(" \t\r") == std::string::npos) {
      }
    }
    try {
      return is_chat_record(io::parse_ordered_json(line, "'" + f.string() + "'"));
    } catch (const Error&) {
      return false;  // read again, and refused naming the line, as text
    }
  }
  return false;
}

bool is_document_file(const fs::path& p) {
  const auto ext = p.extension();
  return ext == ".txt" || ext == ".json" || ext == ".jsonl" || ext == ".parquet" || ext == ".arrow";
}

// Writes `tokens` as one file, or as NAME_000000.bin, ... of at most
// `shard_tokens` each. Returns the number of files.
// The files a split of N tokens is written to: NAME.bin, or NAME_000000.bin
// onwards in shards of SHARD_TOKENS.
std::vector<std::string> split_files(const std::string& name, size_t tokens, int64_t shard_tokens) {
  if (shard_tokens <= 0) return {name + ".bin"};
  std::vector<std::string> files;
  for (size_t start = 0; start < tokens; start += static_cast<size_t>(shard_tokens)) {
    char file[64];
    std::snprintf(file, sizeof(file), "%s_%06zu.bin", name.c_str(), files.size());
    files.push_back(file);
  }
  return files;
}

// The tokens, and for chat data the mask beside each file (empty masks:
// none).
void write_split(const std::string& dir, const std::vector<std::string>& files, const std::vector<int32_t>& tokens,
                 const std::vector<uint8_t>& masks, int64_t shard_tokens, int64_t vocab_size) {
  const size_t per_file = shard_tokens <= 0 ? tokens.size() : static_cast<size_t>(shard_tokens);
  for (size_t k = 0; k < files.size(); ++k) {
    const auto start = static_cast<std::ptrdiff_t>(k * per_file);
    const auto end = static_cast<std::ptrdiff_t>(std::min(tokens.size(), k * per_file + per_file));
    write_token_file(dir + "/" + files[k], {tokens.begin() + start, tokens.begin() + end}, vocab_size);
    if (!masks.empty()) {
      write_loss_mask_file(loss_mask_path(dir + "/" + files[k]), {masks.begin() + start, masks.begin() + end});
    }
  }
}

// Whether NAME is a file `data prepare` writes: train.bin, val.bin, or a
// shard train_NNNNNN.bin / val_NNNNNN.bin, or the .mask beside one.
bool prepare_writes(const std::string& name) {
  const auto digits = [&](size_t from) {
    return std::all_of(name.begin() + static_cast<std::ptrdiff_t>(from),
                       name.begin() + static_cast<std::ptrdiff_t>(from + 6), [](char c) { return c >= '0' && c <= '9'; });
  };
  for (const std::string split : {"train", "val"}) {
    for (const std::string ext : {".bin", ".mask"}) {
      if (name == split + ext) return true;
      if (name.size() == split.size() + 7 + ext.size() && name.compare(0, split.size() + 1, split + "_") == 0 &&
          name.compare(name.size() - ext.size(), ext.size(), ext) == 0 && digits(split.size() + 1)) {
        return true;
      }
    }
  }
  return false;
}

// The document files one --input names: the file, a directory's files, or
// a glob's matches (sorted).
std::vector<fs::path> files_of_input(const std::string& input) {
  std::vector<fs::path> files;
  if (input.find_first_of("*?[") != std::string::npos && !fs::exists(input)) {
    glob_t found{};
    const int rc = ::glob(input.c_str(), 0, nullptr, &found);
    for (size_t i = 0; rc == 0 && i < found.gl_pathc; ++i) {
      if (fs::is_regular_file(found.gl_pathv[i]) && is_document_file(found.gl_pathv[i])) files.emplace_back(found.gl_pathv[i]);
    }
    ::globfree(&found);
    FSDP_CHECK(!files.empty(), "--input '", input, "' matches no .txt, .json, .jsonl, .parquet or .arrow file");
    std::sort(files.begin(), files.end());
  } else if (!fs::exists(input)) {
    throw Error("--input '" + input + "' does not exist");
  } else if (fs::is_directory(input)) {
    // A `datasets` save_to_disk folder: its Arrow files, not its metadata
    // (dataset_info.json, state.json); a DatasetDict's splits are folders.
    const fs::path dir(input);
    FSDP_CHECK(!fs::exists(dir / "dataset_dict.json"), "--input '", input, "' is a datasets DatasetDict folder "
               "(save_to_disk of several splits): give one split's folder, such as '", (dir / "train").string(), "'");
    const bool saved_dataset = fs::exists(dir / "state.json") && fs::exists(dir / "dataset_info.json");
    for (const auto& e : fs::directory_iterator(input)) {
      if (!e.is_regular_file() || !is_document_file(e.path())) continue;
      if (saved_dataset && e.path().extension() != ".arrow") continue;
      files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(input);
  }
  FSDP_CHECK(!files.empty(), "--input '", input, "' holds no .txt, .json, .jsonl, .parquet or .arrow documents");
  return files;
}

// The inputs as the messages name them.
std::string inputs_text(const PrepareOptions& o) {
  std::string text;
  for (const auto& input : o.inputs) text += (text.empty() ? "" : "', '") + input;
  return text;
}

}  // namespace

std::string human_bytes(int64_t bytes) {
  constexpr const char* kUnits[] = {"B", "KB", "MB", "GB", "TB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1000 && unit + 1 < std::size(kUnits)) {
    value /= 1000;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.1f %s", value, kUnits[unit]);
  return text;
}

PrepareStats prepare_corpus(const PrepareOptions& o) {
  FSDP_CHECK(o.val_fraction >= 0 && o.val_fraction < 1, "--val-fraction ", o.val_fraction,
             ": expected 0 <= f < 1 (0: no validation split)");
  FSDP_CHECK(o.shard_tokens == 0 || o.shard_tokens >= 2, "--shard-tokens ", o.shard_tokens,
             ": expected 0 (one file) or at least 2");
  {
    std::error_code ec;
    FSDP_CHECK(!fs::exists(o.out_dir, ec) || fs::is_directory(o.out_dir, ec), "--out-dir '", o.out_dir,
               "' is a file; expected a directory (or a path to create one at)");
  }
  FSDP_CHECK(!o.inputs.empty(), "data prepare: no --input given");
  std::vector<fs::path> files;
  std::vector<std::string> seen;  // each file once, whichever --input names it
  for (const std::string& input : o.inputs) {
    for (const fs::path& f : files_of_input(input)) {
      std::error_code ec;
      const std::string key = fs::weakly_canonical(f, ec).string();
      FSDP_CHECK(std::find(seen.begin(), seen.end(), key) == seen.end(), "--input '", input, "' names '", f.string(),
                 "', which an earlier --input named: each file is read once");
      seen.push_back(key);
      files.push_back(f);
    }
  }
  // Loaded before the corpus is read: a missing tokenizer fails at once.
  const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::from_dir(o.tokenizer_dir);
  const int32_t separator = tokenizer->document_separator();

  // Chat data ([Note: where an answer's loss starts]): every record an
  // example under the model's chat template, with its loss mask.
  const bool chat = holds_chat_data(files, o);
  std::unique_ptr<ChatEncoder> chat_encoder;
  if (chat) chat_encoder = std::make_unique<ChatEncoder>(o.tokenizer_dir, *tokenizer, /*require_template=*/false);
  std::vector<std::string> docs;
  std::vector<Record> records;
  std::vector<size_t> file_of_doc;  // to name the file of a document that fails
  bool preference = false;          // preference records: two examples each, chosen then rejected
  PrepareStats stats;
  stats.examples = chat;
  for (size_t k = 0; k < files.size(); ++k) {
    if (chat) {
      for (auto& r : records_of(files[k], o)) {
        FSDP_CHECK(is_chat_record(r.value), r.where, " is no chat record ({\"messages\": [...]} or {\"prompt\": ..., ",
                   "\"completion\": ...}) though the corpus's first record is: one prepare takes one kind of data");
        if (records.empty()) preference = is_preference_record(r.value);
        FSDP_CHECK(is_preference_record(r.value) == preference, r.where, preference ? " is no preference record" : " is a preference record",
                   " ({\"prompt\": ..., \"chosen\": ..., \"rejected\": ...}) though the corpus's first record ",
                   preference ? "is" : "is not", ": one prepare takes one kind of data");
        stats.bytes += r.bytes;
        records.push_back(std::move(r));
        file_of_doc.push_back(k);
      }
      continue;
    }
    auto file_docs = documents_of(files[k], o);
    if (files[k].extension() == ".txt" && file_docs.size() > 1) stats.split_txt = true;
    for (auto& d : file_docs) {
      stats.bytes += static_cast<int64_t>(d.size());
      docs.push_back(std::move(d));
      file_of_doc.push_back(k);
    }
  }
  const size_t count = chat ? records.size() : docs.size();
  FSDP_CHECK(count > 0, "--input '", inputs_text(o), "' holds no documents: its ", files.size(), " file(s) are empty, "
             "or hold only null or empty texts");
  stats.documents = static_cast<int64_t>(count);

  // Documents are independent: each thread encodes every n-th with its own
  // clone of the tokenizer (the tables are shared, the cache is not).
  const int threads =
      std::max(1, std::min<int>(o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency()),
                                static_cast<int>(count)));
  std::vector<std::vector<int32_t>> encoded(count);
  std::vector<std::vector<uint8_t>> trained(chat ? count : 0);
  // Preference records: where the rejected example starts in the record's tokens.
  std::vector<size_t> second_start(count, 0);
  std::atomic<int64_t> done{0}, done_bytes{0}, answers_left_out{0};
  std::vector<std::thread> pool;
  std::exception_ptr failure;
  std::atomic<bool> failed{false};
  std::mutex failure_mutex;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      try {
        const auto own = tokenizer->clone();
        for (size_t i = static_cast<size_t>(t); i < count && !failed; i += static_cast<size_t>(threads)) {
          if (chat) {
            if (preference) {
              auto [chosen, rejected] = chat_encoder->encode_preference(records[i].value, *own, records[i].where);
              second_start[i] = chosen.tokens.size();
              encoded[i] = std::move(chosen.tokens);
              encoded[i].insert(encoded[i].end(), rejected.tokens.begin(), rejected.tokens.end());
              trained[i] = std::move(chosen.trained);
              trained[i].insert(trained[i].end(), rejected.trained.begin(), rejected.trained.end());
            } else {
              Example example = chat_encoder->encode(records[i].value, *own, records[i].where);
              encoded[i] = std::move(example.tokens);
              trained[i] = std::move(example.trained);
              answers_left_out += example.answers_left_out;
            }
            done_bytes += records[i].bytes;
          } else {
            try {
              encoded[i] = own->encode(docs[i]);
            } catch (const Error& e) {
              throw Error("'" + files[file_of_doc[i]].string() + "': " + e.what());
            }
            done_bytes += static_cast<int64_t>(docs[i].size());
          }
          ++done;
        }
      } catch (...) {
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) failure = std::current_exception();
        failed = true;
      }
    });
  }
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  const auto start = std::chrono::steady_clock::now();
  auto report = [&] {
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "%stokenized %lld/%lld documents, %s/%s (%s/s, %d threads)%s", tty ? "\r" : "",
                 static_cast<long long>(done.load()), static_cast<long long>(count),
                 human_bytes(done_bytes.load()).c_str(), human_bytes(stats.bytes).c_str(),
                 human_bytes(static_cast<int64_t>(static_cast<double>(done_bytes.load()) / std::max(secs, 1e-9))).c_str(),
                 threads, tty ? "" : "\n");
  };
  // Polled often, reported every 200 ms on a terminal and every 5 s in a
  // log: a small corpus must not wait out a whole report interval.
  const auto interval = std::chrono::milliseconds(tty ? 200 : 5000);
  auto last_report = start;
  while (o.progress && done.load() < stats.documents && !failed) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (done.load() < stats.documents && std::chrono::steady_clock::now() - last_report >= interval) {
      report();
      last_report = std::chrono::steady_clock::now();
    }
  }
  for (auto& th : pool) th.join();
  if (failure) std::rethrow_exception(failure);
  if (o.progress) {
    report();
    if (tty) std::fprintf(stderr, "\n");
  }

  const auto every = o.val_fraction > 0 ? static_cast<size_t>(std::max(2.0, std::round(1.0 / o.val_fraction))) : 0;
  // Text: each document after the separator. Chat data: each example as
  // its template renders it, its mask beside.
  std::vector<int32_t> train, val;
  std::vector<uint8_t> train_mask, val_mask;
  for (size_t i = 0; i < encoded.size(); ++i) {
    const bool held_out = o.validation_only || (every > 0 && encoded.size() > 1 && i % every == every - 1);
    auto& dest = held_out ? val : train;
    if (chat) {
      auto& mask = held_out ? val_mask : train_mask;
      for (size_t k = 0; k < trained[i].size(); ++k) {
        const bool starts = k == 0 || (second_start[i] > 0 && k == second_start[i]);
        mask.push_back(static_cast<uint8_t>((trained[i][k] ? kMaskTrained : 0) | (starts ? kMaskExampleStart : 0)));
      }
    } else {
      dest.push_back(separator);
    }
    dest.insert(dest.end(), encoded[i].begin(), encoded[i].end());
  }
  if (every > 0 && val.empty() && !o.validation_only) {
    // Fewer documents than one in `every`: the last whole document is held
    // out (never part of one: a cut document would be half in each split).
    if (encoded.size() >= 2) {
      const size_t last = encoded.back().size() + (chat ? 0 : 1);
      val.assign(train.end() - static_cast<std::ptrdiff_t>(last), train.end());
      train.resize(train.size() - last);
      if (chat) {
        val_mask.assign(train_mask.end() - static_cast<std::ptrdiff_t>(last), train_mask.end());
        train_mask.resize(train_mask.size() - last);
      }
      stats.note = std::to_string(encoded.size()) + " documents, fewer than the " + std::to_string(every) +
                   " one in --val-fraction needs: the last document is held out for validation";
    } else {
      stats.note = "one document: no validation split (a document is never cut in two; --val-fraction needs at least 2)";
    }
  }
  FSDP_CHECK(o.validation_only || train.size() >= 2, "--input '", inputs_text(o), "' gives ", train.size(),
             " training tokens; at least 2 are needed");
  FSDP_CHECK(!o.validation_only || val.size() >= 2, "--input '", inputs_text(o), "' gives ", val.size(),
             " validation tokens; at least 2 are needed");
  const auto train_files =
      o.validation_only ? std::vector<std::string>{} : split_files("train", train.size(), o.shard_tokens);
  // A split too small to hold one target is not written: it would only fail later.
  const auto val_files = val.size() >= 2 ? split_files("val", val.size(), o.shard_tokens) : std::vector<std::string>{};
  // [Note: a prepared folder is one prepare's]: the record goes first,
  // listing the files to come and saying the prepare has not finished;
  // then token files an earlier prepare left here and this one does not
  // write are removed, the new ones written, and the record completed. A
  // prepare stopped anywhere leaves a record that the trainer refuses, and
  // a stray shard that a glob would pick up is not in the record's list.
  fs::create_directories(o.out_dir);
  auto record = record_of(*tokenizer);
  record.files = train_files;
  record.files.insert(record.files.end(), val_files.begin(), val_files.end());
  record.complete = false;
  record.examples = chat;
  record.preference_pairs = preference;
  write_tokenizer_record(o.out_dir, record);
  std::vector<std::string> stale;
  for (const auto& entry : fs::directory_iterator(o.out_dir)) {
    const std::string name = entry.path().filename().string();
    if (prepare_writes(name) && std::find(record.files.begin(), record.files.end(), name) == record.files.end()) {
      stale.push_back(name);
    }
  }
  std::sort(stale.begin(), stale.end());
  for (const auto& name : stale) fs::remove(fs::path(o.out_dir) / name);
  write_split(o.out_dir, train_files, train, train_mask, o.shard_tokens, tokenizer->vocab_size());
  write_split(o.out_dir, val_files, val, val_mask, o.shard_tokens, tokenizer->vocab_size());
  record.complete = true;
  write_tokenizer_record(o.out_dir, record);
  stats.train_files = static_cast<int>(train_files.size());
  stats.val_files = static_cast<int>(val_files.size());
  stats.train_tokens = static_cast<int64_t>(train.size());
  stats.val_tokens = stats.val_files > 0 ? static_cast<int64_t>(val.size()) : 0;
  stats.separator = chat ? -1 : separator;
  stats.preference_pairs = preference;
  stats.answers_left_out = answers_left_out;
  for (size_t i = 0; i < trained.size(); ++i) {
    stats.trained_tokens += std::count(trained[i].begin(), trained[i].end(), uint8_t{1});
    const size_t second = second_start[i] > 0 ? trained[i].size() - second_start[i] : 0;
    stats.longest_example =
        std::max<int64_t>(stats.longest_example, static_cast<int64_t>(std::max(trained[i].size() - second, second)));
  }
  stats.tokenizer = tokenizer->source();
  stats.removed = stale;
  return stats;
}

}  // namespace fsdp::data
