#include "fsdp/io/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"

namespace fsdp::io {
namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

void check_mode(const struct stat& st, const std::string& path, const std::string& what) {
  FSDP_CHECK(S_ISREG(st.st_mode), what, " '", path, "' is ", kind_of(st.st_mode), "; expected a regular file");
}

// The deepest nesting of arrays and objects in `text`, strings skipped;
// stops counting once past `limit`.
int nesting_depth(const std::string& text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest && (deepest = depth) > limit) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

void check_regular_file(const std::string& path, const std::string& what) {
  struct stat st {};
  FSDP_CHECK(::stat(path.c_str(), &st) == 0, "cannot open ", what, " '", path, "': ", std::strerror(errno));
  check_mode(st, path, what);
}

int open_regular_file(const std::string& path, const std::string& what) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  FSDP_CHECK(fd >= 0, "cannot open ", what, " '", path, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int saved = errno;
    ::close(fd);
    FSDP_CHECK(st.st_mode != 0, "cannot stat ", what, " '", path, "': ", std::strerror(saved));
    check_mode(st, path, what);
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

std::string read_file(const std::string& path, const std::string& what) {
  const int fd = open_regular_file(path, what);
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_size > kMaxTextFileBytes) {
    ::close(fd);
    throw Error(what + " '" + path + "' is " + std::to_string(st.st_size) + " bytes; no such file is larger than " +
                std::to_string(kMaxTextFileBytes >> 20) + " MiB (corrupt or hostile)");
  }
  std::string text;
  char buf[1 << 16];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  const int saved = errno;
  ::close(fd);
  FSDP_CHECK(n == 0, "cannot read ", what, " '", path, "': ", std::strerror(saved));
  return text;
}

namespace {

// Both JSON kinds (keys sorted, keys in order) under the same bound.
template <typename Json>
Json parse_bounded(const std::string& text, const std::string& what) {
  FSDP_CHECK(nesting_depth(text, kMaxJsonDepth) <= kMaxJsonDepth, what, " nests arrays and objects deeper than ",
             kMaxJsonDepth, " levels, which no file of this kind needs (corrupt or hostile)");
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(what + " is not valid JSON (" + e.what() + ")");
  }
}

}  // namespace

nlohmann::json parse_json(const std::string& text, const std::string& what) {
  return parse_bounded<nlohmann::json>(text, what);
}

nlohmann::ordered_json parse_ordered_json(const std::string& text, const std::string& what) {
  return parse_bounded<nlohmann::ordered_json>(text, what);
}

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  return parse_json(read_file(path, what), what + " '" + path + "'");
}

}  // namespace fsdp::io
