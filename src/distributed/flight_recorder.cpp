#include "fsdp/distributed/flight_recorder.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>

namespace fsdp::dist {
namespace {

constexpr char kMagic[8] = {'F', 'S', 'D', 'P', 'F', 'R', '1', '\0'};
constexpr int64_t kDefaultCapacity = 256;

struct FileHeader {
  char magic[8];
  int64_t capacity;
  int64_t count;  // entries ever issued; entry s lives at slot (s - 1) % capacity
  int32_t rank;
  int32_t pid;
};

thread_local const std::string* t_unit = nullptr;

void copy_name(char* dst, size_t size, const char* src) {
  std::strncpy(dst, src, size - 1);
  dst[size - 1] = '\0';
}

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ULL;
  }
  return h;
}

std::string human_bytes(int64_t bytes) {
  char text[32];
  if (bytes >= (1 << 20)) {
    std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  } else if (bytes >= 1024) {
    std::snprintf(text, sizeof(text), "%.1f KiB", static_cast<double>(bytes) / 1024);
  } else {
    std::snprintf(text, sizeof(text), "%lld B", static_cast<long long>(bytes));
  }
  return text;
}

std::string record_path(const std::string& dir, int rank, const char* ext) {
  return dir + "/rank" + std::to_string(rank) + ext;
}

std::vector<FlightEntry> ordered(const FileHeader& h, const FlightEntry* ring) {
  std::vector<FlightEntry> out;
  const int64_t first = std::max<int64_t>(1, h.count - h.capacity + 1);
  for (int64_t s = first; s <= h.count; ++s) out.push_back(ring[(s - 1) % h.capacity]);
  return out;
}

}  // namespace

int64_t system_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string FlightEntry::describe() const {
  std::string text = std::string(op) + " #" + std::to_string(seq) + " on group '" + group + "' (" +
                     std::to_string(numel) + " " + dtype + ", " + human_bytes(bytes);
  if (unit[0] != '\0') text += ", unit '" + std::string(unit) + "'";
  return text + ")";
}

bool FlightEntry::same_call(const FlightEntry& o) const {
  return seq == o.seq && numel == o.numel && bytes == o.bytes && group_size == o.group_size &&
         std::strcmp(op, o.op) == 0 && std::strcmp(role, o.role) == 0 && std::strcmp(dtype, o.dtype) == 0;
}

struct FlightRecorder::Impl {
  mutable std::mutex mutex;
  FileHeader* header = nullptr;
  FlightEntry* ring = nullptr;
  std::string dir;  // empty: in memory only
  int rank = 0;
  uint64_t fingerprint = 1469598103934665603ULL;
  FlightRecorder::Totals totals;
  std::vector<char> memory;  // backing store when not file-backed
};

FlightRecorder::FlightRecorder() : impl_(new Impl) {
  int64_t capacity = kDefaultCapacity;
  if (const char* k = std::getenv("FSDP_FLIGHT_RECORDER"); k != nullptr && std::atoll(k) > 0) capacity = std::atoll(k);
  if (const char* r = std::getenv("RANK")) impl_->rank = std::atoi(r);
  const size_t size = sizeof(FileHeader) + static_cast<size_t>(capacity) * sizeof(FlightEntry);
  void* base = nullptr;
  if (const char* dir = std::getenv("FSDP_FLIGHT_RECORDER_DIR"); dir != nullptr && *dir != '\0') {
    const std::string path = record_path(dir, impl_->rank, ".fr");
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(size)) == 0) {
      base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (base == MAP_FAILED) base = nullptr;
    }
    if (fd >= 0) ::close(fd);
    if (base != nullptr) impl_->dir = dir;  // otherwise: in memory, still printed on failure
  }
  if (base == nullptr) {
    impl_->memory.assign(size, 0);
    base = impl_->memory.data();
  }
  impl_->header = static_cast<FileHeader*>(base);
  impl_->ring = reinterpret_cast<FlightEntry*>(static_cast<char*>(base) + sizeof(FileHeader));
  impl_->header->capacity = capacity;
  impl_->header->count = 0;
  impl_->header->rank = impl_->rank;
  impl_->header->pid = static_cast<int32_t>(::getpid());
  std::memcpy(impl_->header->magic, kMagic, sizeof(kMagic));  // last: a reader sees a whole header or none
}

FlightRecorder& FlightRecorder::instance() {
  static FlightRecorder* recorder = new FlightRecorder();  // never destroyed: ranks record until exit
  return *recorder;
}

int64_t FlightRecorder::issue(const char* op, const std::string& group, const std::string& role, int group_rank,
                              int group_size, int64_t numel, int64_t bytes, const char* dtype) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  FileHeader& h = *impl_->header;
  const int64_t seq = h.count + 1;
  FlightEntry& e = impl_->ring[(seq - 1) % h.capacity];
  e = FlightEntry{};
  e.seq = seq;
  e.bytes = bytes;
  e.numel = numel;
  e.group_rank = group_rank;
  e.group_size = group_size;
  copy_name(e.op, sizeof(e.op), op);
  copy_name(e.group, sizeof(e.group), group.c_str());
  copy_name(e.role, sizeof(e.role), role.c_str());
  copy_name(e.dtype, sizeof(e.dtype), dtype);
  if (t_unit != nullptr) {
    copy_name(e.unit, sizeof(e.unit), t_unit->c_str());
    ++impl_->totals.labeled;
    impl_->totals.labeled_bytes += bytes;
  }
  e.issued_ns = system_now_ns();
  h.count = seq;
  uint64_t fp = impl_->fingerprint;
  fp = fnv1a(fp, e.op, std::strlen(e.op));
  fp = fnv1a(fp, e.role, std::strlen(e.role));
  fp = fnv1a(fp, e.dtype, std::strlen(e.dtype));
  fp = fnv1a(fp, &numel, sizeof(numel));
  impl_->fingerprint = fp;
  return seq;
}

void FlightRecorder::complete(int64_t seq, bool ok) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const FileHeader& h = *impl_->header;
  if (seq <= 0 || seq <= h.count - h.capacity || seq > h.count) return;  // unrecorded, or already overwritten
  impl_->ring[(seq - 1) % h.capacity].completed_ns = ok ? system_now_ns() : FlightEntry::kFailed;
}

uint64_t FlightRecorder::fingerprint() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->fingerprint & ((1ULL << 52) - 1);
}

FlightRecorder::Totals FlightRecorder::totals() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->totals;
}

void FlightRecorder::add_blocked(int64_t ns) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->totals.blocked_ns += ns;
}

int64_t FlightRecorder::issued() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->header->count;
}

std::vector<FlightEntry> FlightRecorder::entries() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return ordered(*impl_->header, impl_->ring);
}

std::optional<FlightEntry> FlightRecorder::find(int64_t seq) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const FileHeader& h = *impl_->header;
  if (seq <= 0 || seq <= h.count - h.capacity || seq > h.count) return std::nullopt;
  return impl_->ring[(seq - 1) % h.capacity];
}

std::string FlightRecorder::dump(size_t n) const {
  const auto all = entries();
  const int64_t now = system_now_ns();
  std::string text;
  for (size_t i = all.size() > n ? all.size() - n : 0; i < all.size(); ++i) {
    const FlightEntry& e = all[i];
    char when[96];
    const double age = static_cast<double>(now - e.issued_ns) * 1e-9;
    if (e.in_flight()) {
      std::snprintf(when, sizeof(when), "in flight, issued %.1f s ago", age);
    } else if (e.completed_ns == FlightEntry::kFailed) {
      std::snprintf(when, sizeof(when), "FAILED, issued %.1f s ago", age);
    } else {
      std::snprintf(when, sizeof(when), "done in %.3f s", static_cast<double>(e.completed_ns - e.issued_ns) * 1e-9);
    }
    text += "  " + e.describe() + ": " + when + "\n";
  }
  return text;
}

void FlightRecorder::write_text_dump() const {
  if (impl_->dir.empty()) return;
  std::ofstream out(record_path(impl_->dir, impl_->rank, ".txt"));
  out << "flight recorder of rank " << impl_->rank << " (pid " << ::getpid() << "), oldest first:\n"
      << dump(static_cast<size_t>(impl_->header->capacity));
}

void FlightRecorder::report_failure(int64_t seq) {
  complete(seq, false);
  write_text_dump();
  // Once: collectives failing after the first (the group is unusable by
  // then) add nothing but noise. See [Note: one account of a failure].
  static std::atomic<bool> printed{false};
  if (printed.exchange(true)) return;
  const char* reader = std::getenv(kLauncherReadsRecordsVar);
  if (!impl_->dir.empty() && reader != nullptr && std::string(reader) == "1") return;
  std::fprintf(stderr, "fsdp: the last collectives of this rank (flight recorder):\n%s", dump(8).c_str());
}

CollectiveLabel::CollectiveLabel(const std::string& unit) : previous_(t_unit) { t_unit = &unit; }
CollectiveLabel::~CollectiveLabel() { t_unit = previous_; }

std::string text_dump_path(const std::string& dir, int rank) { return record_path(dir, rank, ".txt"); }

std::optional<RankRecord> read_rank_record(const std::string& dir, int rank) {
  std::ifstream in(record_path(dir, rank, ".fr"), std::ios::binary);
  FileHeader h{};
  if (!in.read(reinterpret_cast<char*>(&h), sizeof(h))) return std::nullopt;
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0 || h.capacity <= 0 || h.capacity > (1 << 24) ||
      h.count < 0) {
    return std::nullopt;
  }
  std::vector<FlightEntry> ring(static_cast<size_t>(h.capacity));
  if (!in.read(reinterpret_cast<char*>(ring.data()), static_cast<std::streamsize>(ring.size() * sizeof(FlightEntry)))) {
    return std::nullopt;
  }
  for (auto& e : ring) {  // a record torn by a crash must still print safely
    e.op[sizeof(e.op) - 1] = e.group[sizeof(e.group) - 1] = e.dtype[sizeof(e.dtype) - 1] = '\0';
    e.role[sizeof(e.role) - 1] = e.unit[sizeof(e.unit) - 1] = '\0';
  }
  RankRecord record;
  record.rank = rank;
  record.pid = h.pid;
  record.entries = ordered(h, ring.data());
  return record;
}

namespace {

std::string seconds_ago(int64_t now_ns, int64_t then_ns) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s ago", static_cast<double>(now_ns - then_ns) * 1e-9);
  return text;
}

// "killed by signal 9, SIGKILL"
std::string killed_by(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return "killed by signal " + std::to_string(sig) + (abbrev != nullptr ? std::string(", SIG") + abbrev : "");
}

// What a dead rank's record says it did last.
std::string last_words(const std::vector<FlightEntry>& entries, int64_t now_ns) {
  if (entries.empty()) return " and issued no collective";
  const FlightEntry& last = entries.back();
  if (last.in_flight()) {
    return "; its last collective, in flight when it died: " + last.describe() + ", issued " +
           seconds_ago(now_ns, last.issued_ns);
  }
  if (last.completed_ns == FlightEntry::kFailed) {
    return "; its last collective, which failed: " + last.describe() + ", issued " +
           seconds_ago(now_ns, last.issued_ns);
  }
  return "; its last collective: " + last.describe() + ", completed " + seconds_ago(now_ns, last.completed_ns);
}

}  // namespace

std::vector<std::string> summarize_ranks(const std::vector<RankRecord>& ranks, int64_t now_ns) {
  std::vector<std::string> lines;
  for (const auto& r : ranks) {
    const std::string who = "rank " + std::to_string(r.rank);
    // The stop comes first: a rank held stopped at the failure is the cause,
    // whatever it died of once continued (its sockets were closed by then,
    // so often SIGPIPE).
    if (r.stopped) {
      const std::string then = r.killed_by_signal != 0 ? " (then " + killed_by(r.killed_by_signal) + ")" : "";
      lines.push_back(who + " was stopped (SIGSTOP, Ctrl-Z or a debugger) while the others waited for it" + then +
                      last_words(r.entries, now_ns));
      continue;
    }
    if (r.killed_by_signal != 0) {
      lines.push_back(who + " is dead (" + killed_by(r.killed_by_signal) + ")" + last_words(r.entries, now_ns));
      continue;
    }
    if (r.entries.empty()) {
      lines.push_back(who + " issued no collective");
      continue;
    }
    const auto waiting = std::find_if(r.entries.begin(), r.entries.end(),
                                      [](const FlightEntry& e) { return e.completed_ns <= 0; });
    char age[48];
    if (waiting != r.entries.end()) {
      std::snprintf(age, sizeof(age), ", issued %.1f s ago", static_cast<double>(now_ns - waiting->issued_ns) * 1e-9);
      const char* verb = waiting->completed_ns == FlightEntry::kFailed ? " failed in " : " waits in ";
      lines.push_back(who + verb + waiting->describe() + age);
    } else {
      const FlightEntry& last = r.entries.back();
      std::snprintf(age, sizeof(age), ", %.1f s ago", static_cast<double>(now_ns - last.completed_ns) * 1e-9);
      lines.push_back(who + " last completed " + last.describe() + age);
    }
  }
  return lines;
}

}  // namespace fsdp::dist
