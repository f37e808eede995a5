#include "fsdp/io/remove_tree.h"

#include <ftw.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>

#include "fsdp/common/error.h"

namespace fsdp::io {
namespace {

// nftw takes a plain function: its running totals live per thread.
thread_local std::uintmax_t t_removed = 0;
thread_local int t_error = 0;

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  if (std::remove(path) == 0) {
    ++t_removed;
    return 0;
  }
  if (errno == ENOENT) return 0;  // gone meanwhile: what we wanted
  t_error = errno;
  return 1;  // stop the walk
}

}  // namespace

std::uintmax_t remove_tree(const std::string& path, std::error_code& ec) noexcept {
  ec.clear();
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return 0;
    ec = std::error_code(errno, std::generic_category());
    return UINTMAX_MAX;
  }
  t_removed = 0;
  t_error = 0;
  // Children before their directory (FTW_DEPTH); links themselves (FTW_PHYS).
  if (::nftw(path.c_str(), remove_entry, 32, FTW_DEPTH | FTW_PHYS) != 0) {
    ec = std::error_code(t_error != 0 ? t_error : errno, std::generic_category());
    return UINTMAX_MAX;
  }
  return t_removed;
}

std::uintmax_t remove_tree(const std::string& path) {
  std::error_code ec;
  const std::uintmax_t removed = remove_tree(path, ec);
  FSDP_CHECK(!ec, "cannot remove '", path, "': ", ec.message());
  return removed;
}

}  // namespace fsdp::io
