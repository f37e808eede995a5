#include "fsdp/train/run_folder.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "fsdp/common/error.h"

namespace fsdp::train {
namespace fs = std::filesystem;

std::string default_run_name(const std::string& model, int64_t unix_seconds) {
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm);
  std::string name = model.empty() ? "run" : model;
  for (char& c : name) {
    if (c == '/' || c == ' ') c = '_';
  }
  return name + "-" + stamp;
}

void check_writable_dir(const std::string& path, const std::string& flag) {
  std::error_code ec;
  FSDP_CHECK(!fs::exists(path, ec) || fs::is_directory(path, ec), flag, " '", path,
             "' is a file; expected a directory (or a path to create one at)");
  fs::create_directories(path, ec);
  FSDP_CHECK(!ec, flag, " '", path, "': cannot create the directory (", ec.message(), ")");
  FSDP_CHECK(::access(path.c_str(), W_OK | X_OK) == 0, flag, " '", path, "': the directory is not writable (",
             std::strerror(errno), ")");
}

void check_writable_file(const std::string& path, const std::string& flag) {
  std::error_code ec;
  FSDP_CHECK(!fs::is_directory(path, ec), flag, " '", path, "' is a directory; expected a file");
  const auto parent = fs::path(path).parent_path();
  check_writable_dir(parent.empty() ? "." : parent.string(), flag + " (its directory)");
}

std::string set_aside_earlier_run(const RunFolder& folder) {
  const char* entries[] = {"config.yaml", "metrics.jsonl", "tensorboard", "logs", "traces"};
  bool any = false;
  for (const char* e : entries) any = any || fs::exists(fs::path(folder.dir) / e);
  if (!any) return "";
  int n = 1;
  while (fs::exists(fs::path(folder.dir) / ("earlier-" + std::to_string(n)))) ++n;
  const fs::path aside = fs::path(folder.dir) / ("earlier-" + std::to_string(n));
  fs::create_directories(aside);
  for (const char* e : entries) {
    const fs::path from = fs::path(folder.dir) / e;
    if (fs::exists(from)) fs::rename(from, aside / e);
  }
  return aside.string();
}

}  // namespace fsdp::train
