#include "fsdp/common/fault_point.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "fsdp/common/env.h"
#include "fsdp/common/error.h"

namespace fsdp {
namespace {

bool is_fault_point(const std::string& name) {
  for (const char* point : kFaultPoints) {
    if (name == point) return true;
  }
  return false;
}

std::string fault_point_list() {
  std::string list;
  for (const char* point : kFaultPoints) list += (list.empty() ? "" : ", ") + std::string(point);
  return list;
}

// In place of a signal: throw fsdp::Error.
constexpr int kThrow = -1;

struct Arming {
  long visit = 1;  // the visit that is sent the signal, from 1
  int signal = SIGKILL;
};

int parse_signal(const std::string& name, const std::string& text) {
  if (name == "KILL") return SIGKILL;
  if (name == "TERM") return SIGTERM;
  if (name == "INT") return SIGINT;
  if (name == "THROW") return kThrow;
  FSDP_CHECK(false, kFaultPointVar, "=", text, ": signal '", name, "' is none of KILL, TERM, INT, THROW");
  return 0;
}

// NAME[@N][:SIGNAL][,...] -> point: the visit and the signal.
std::map<std::string, Arming> parse_fault_points(const std::string& text) {
  std::map<std::string, Arming> arm;
  for (size_t start = 0; start <= text.size();) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(start, end - start);
    start = end + 1;
    if (item.empty()) continue;
    int signal = SIGKILL;
    if (const size_t colon = item.find(':'); colon != std::string::npos) {
      signal = parse_signal(item.substr(colon + 1), text);
      item.erase(colon);
    }
    const size_t at = item.find('@');
    const std::string name = item.substr(0, at);
    FSDP_CHECK(is_fault_point(name), kFaultPointVar, " names '", name, "', which is not a fault point (",
               fault_point_list(), "; include/fsdp/common/fault_point.h)");
    const long n = at == std::string::npos
                       ? 1
                       : parse_non_negative(item.substr(at + 1), std::string(kFaultPointVar) + "'s count for " + name);
    FSDP_CHECK(n >= 1, kFaultPointVar, "=", text, ": the count after '@' is the visit that dies, from 1");
    arm[name] = {n, signal};
  }
  return arm;
}

struct ArmedPoints {
  std::map<std::string, Arming> arm;  // fixed once read
  std::mutex mutex;
  std::map<std::string, long> visits;
};

ArmedPoints& armed_points() {
  static ArmedPoints* points = [] {
    auto* p = new ArmedPoints;  // never destroyed: a point may be reached during exit
    const char* text = std::getenv(kFaultPointVar);
    if (text == nullptr || *text == '\0') return p;
    auto arm = parse_fault_points(text);  // checked in every attempt
    const char* attempt = std::getenv("FSDP_RESTART_ATTEMPT");  // dist::kRestartAttemptVar, set by fsdp launch
    if (attempt == nullptr || std::atoi(attempt) == 0) p->arm = std::move(arm);
    return p;
  }();
  return *points;
}

}  // namespace

void check_fault_points() { (void)armed_points(); }

void fault_point(const char* name) {
  FSDP_ASSERT(is_fault_point(name));
  ArmedPoints& points = armed_points();
  if (points.arm.empty()) return;
  const auto it = points.arm.find(name);
  if (it == points.arm.end()) return;
  std::lock_guard<std::mutex> lock(points.mutex);
  if (++points.visits[name] != it->second.visit) return;
  const int sig = it->second.signal;
  if (sig == kThrow) {
    throw Error(detail::concat("fault point ", name, " reached (", kFaultPointVar, "): an injected failure"));
  }
  std::fprintf(stderr, "fsdp: fault point %s reached (%s): sending this process %s\n", name, kFaultPointVar,
               sig == SIGKILL ? "SIGKILL" : sig == SIGTERM ? "SIGTERM" : "SIGINT");
  std::fflush(stderr);
  // To this thread, so that it goes no further before the signal is taken.
  ::raise(sig);
}

}  // namespace fsdp
