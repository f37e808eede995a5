#pragma once
// Opening the files a user or another program hands us, defensively: only
// regular files (a FIFO named as a weight, token or config file would block
// `open()` forever; a directory or a device is a mistake to name), and JSON
// parsed with a bound on its nesting (a 184 KB tokenizer.json nested 50,000
// deep otherwise exhausts the stack of every recursive reader and printer).
// Light header: no LibTorch.

#include <string>

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace fsdp::io {

// Deeper than any file we read legitimately nests (Hugging Face configs and
// tokenizers stay under 10), far below what recursion can survive.
constexpr int kMaxJsonDepth = 64;

// Throws fsdp::Error naming `path` (described as `what`) unless it is a
// regular file, following symbolic links: "is a FIFO; expected a regular
// file", "does not exist", ...
void check_regular_file(const std::string& path, const std::string& what);

// A read-only descriptor (O_CLOEXEC) of a regular file; never blocks on a
// FIFO. Throws as check_regular_file.
int open_regular_file(const std::string& path, const std::string& what);

// Larger than any text file we read whole (configs, tokenizer.json files,
// checkpoint metadata: the largest tokenizer.json files are tens of MB).
constexpr int64_t kMaxTextFileBytes = int64_t{1} << 30;

// The whole file, checked as above; one of more than kMaxTextFileBytes is
// refused by its size before anything is read.
std::string read_file(const std::string& path, const std::string& what);

// `text` parsed; throws fsdp::Error "<what> is not valid JSON (...)" or
// "<what> nests deeper than 64 levels" before the parser builds anything.
nlohmann::json parse_json(const std::string& text, const std::string& what);
// parse_json, keeping each object's keys in their order (chat records,
// whose order a chat template writes back).
nlohmann::ordered_json parse_ordered_json(const std::string& text, const std::string& what);
// read_file, then parse_json.
nlohmann::json read_json_file(const std::string& path, const std::string& what);

}  // namespace fsdp::io
