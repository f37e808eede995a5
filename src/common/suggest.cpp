#include "fsdp/common/suggest.h"

#include <algorithm>

namespace fsdp {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string did_you_mean(const std::string& name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::string::npos;
  for (const auto& c : candidates) {
    // A name that extends a candidate ("optimizer" for "optim") is as good as a typo.
    const bool prefix = !c.empty() && (name.rfind(c, 0) == 0 || c.rfind(name, 0) == 0);
    const size_t d = prefix ? 1 : edit_distance(name, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  // Close enough to be a typo: at most a third of the name changed.
  if (best.empty() || best_distance > std::max<size_t>(2, name.size() / 3)) return "";
  return "; did you mean '" + best + "'?";
}

std::string join_words(const std::vector<std::string>& words, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) out += (i ? sep : "") + words[i];
  return out;
}

}  // namespace fsdp
