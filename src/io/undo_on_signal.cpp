#include "fsdp/io/undo_on_signal.h"

#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>

#include "fsdp/common/error.h"

namespace fsdp::io {
namespace {

// Set in normal context before the count that publishes them, read by the
// handler: no allocation, no lock.
struct Entry {
  bool is_dir;
  char path[PATH_MAX];
};
constexpr int kMaxEntries = 64;
Entry g_entries[kMaxEntries];
std::atomic<int> g_count{0};
std::atomic<bool> g_armed{false};

void undo_registered() {
  const int n = g_count.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    if (!g_entries[i].is_dir) ::unlink(g_entries[i].path);
  }
  // Until a pass removes nothing: a directory listed before one inside it
  // empties on a later pass.
  for (bool removed = true; removed;) {
    removed = false;
    for (int i = 0; i < n; ++i) {
      if (g_entries[i].is_dir && ::rmdir(g_entries[i].path) == 0) removed = true;
    }
  }
}

void on_stop_signal(int sig) {
  undo_registered();
  // The signal is blocked while its handler runs: raised now, it is taken
  // with the default action as the handler returns.
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void add(bool is_dir, const std::string& path) {
  const int n = g_count.load(std::memory_order_relaxed);
  FSDP_CHECK(n < kMaxEntries, "internal: more than ", kMaxEntries, " paths to undo on a stop signal");
  FSDP_CHECK(path.size() < PATH_MAX, "internal: a path to undo on a stop signal is over PATH_MAX: ", path);
  g_entries[n].is_dir = is_dir;
  std::memcpy(g_entries[n].path, path.c_str(), path.size() + 1);
  g_count.store(n + 1, std::memory_order_release);
}

}  // namespace

UndoOnSignal::UndoOnSignal() {
  FSDP_CHECK(!g_armed.exchange(true), "internal: two UndoOnSignal at once");
  g_count.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  // Either signal waits while the other's handler runs: one undo, one death.
  sigaddset(&sa.sa_mask, SIGTERM);
  sigaddset(&sa.sa_mask, SIGINT);
  ::sigaction(SIGTERM, &sa, &previous_term_);
  ::sigaction(SIGINT, &sa, &previous_int_);
}

UndoOnSignal::~UndoOnSignal() {
  ::sigaction(SIGTERM, &previous_term_, nullptr);
  ::sigaction(SIGINT, &previous_int_, nullptr);
  g_count.store(0);
  g_armed.store(false);
}

void UndoOnSignal::remove_file(const std::string& path) { add(false, path); }

void UndoOnSignal::remove_empty_dirs(const std::string& dir, const std::string& top) {
  namespace fs = std::filesystem;
  if (top.empty()) return;
  std::error_code ec;
  // Absolute, and without a trailing separator ("run/" is "run").
  const auto clean = [&ec](const std::string& path) {
    fs::path q = fs::absolute(path, ec).lexically_normal();
    return q.has_filename() || q == q.root_path() ? q : q.parent_path();
  };
  const fs::path last = clean(top);
  fs::path p = clean(dir);
  const auto [end, unused] = std::mismatch(last.begin(), last.end(), p.begin(), p.end());
  if (ec || end != last.end()) return;  // `dir` is not inside `top`
  for (;; p = p.parent_path()) {
    add(true, p.string());
    if (p == last || p == p.parent_path()) break;
  }
}

}  // namespace fsdp::io
