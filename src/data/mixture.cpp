#include "fsdp/data/mixture.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "fsdp/common/error.h"

namespace fsdp::data {
namespace {

std::vector<std::string> split_commas(const std::string& spec) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = spec.find(',', start);
    out.push_back(spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

}  // namespace

std::vector<WeightedSource> parse_mixture(const std::string& spec, const std::string& flag) {
  std::vector<WeightedSource> out;
  size_t unweighted = 0;
  for (const auto& item : split_commas(spec)) {
    const size_t colon = item.rfind(':');
    const std::string tail = colon == std::string::npos ? "" : item.substr(colon + 1);
    char* end = nullptr;
    const double weight = tail.empty() ? 0.0 : std::strtod(tail.c_str(), &end);
    if (tail.empty() || end != tail.c_str() + tail.size()) {
      ++unweighted;
      out.push_back({item, 0.0});
      continue;
    }
    FSDP_CHECK(std::isfinite(weight) && weight > 0, flag, " '", spec, "': the weight of '", item.substr(0, colon),
               "' is ", tail, "; expected a positive number (A:0.7,B:0.3)");
    FSDP_CHECK(colon > 0, flag, " '", spec, "': a weight ':", tail, "' without a source before it");
    out.push_back({item.substr(0, colon), weight});
  }
  if (unweighted == out.size()) return {};
  FSDP_CHECK(unweighted == 0, flag, " '", spec, "' weights some sources and not others: give each a weight ",
             "(A:0.7,B:0.3) to mix them, or none to read them one after another");
  double total = 0;
  for (const auto& s : out) total += s.weight;
  for (auto& s : out) {
    s.weight /= total;
    FSDP_CHECK(s.weight * static_cast<double>(MixtureSchedule::kPeriod) >= 1.0, flag, " '", spec, "': '", s.source,
               "' would get ", s.weight, " of the data, less than one sequence in ", MixtureSchedule::kPeriod,
               "; raise its weight or leave it out");
  }
  return out;
}

std::string mixture_paths(const std::string& spec, const std::string& flag) {
  const auto parts = parse_mixture(spec, flag);
  if (parts.empty()) return spec;
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ",") + p.source;
  return out;
}

MixtureSchedule::MixtureSchedule(const std::vector<double>& weights) {
  FSDP_CHECK(!weights.empty(), "a mixture of no sources");
  double total = 0;
  for (double w : weights) total += w;
  // Largest remainders: the slots add up to the period exactly.
  const auto n = weights.size();
  std::vector<double> exact(n);
  int64_t given = 0;
  for (size_t d = 0; d < n; ++d) {
    exact[d] = weights[d] / total * static_cast<double>(kPeriod);
    slots_.push_back(std::max<int64_t>(1, static_cast<int64_t>(std::floor(exact[d]))));
    given += slots_.back();
  }
  std::vector<size_t> by_remainder(n);
  for (size_t d = 0; d < n; ++d) by_remainder[d] = d;
  std::stable_sort(by_remainder.begin(), by_remainder.end(), [&](size_t a, size_t b) {
    return exact[a] - std::floor(exact[a]) > exact[b] - std::floor(exact[b]);
  });
  for (size_t k = 0; given < kPeriod; k = (k + 1) % n, ++given) ++slots_[by_remainder[k]];
  while (given > kPeriod) {  // sources raised to one slot: taken from the largest
    --*std::max_element(slots_.begin(), slots_.end());
    --given;
  }
  // Smooth weighted round-robin over one period.
  std::vector<int64_t> taken(n, 0);
  for (int64_t s = 0; s < kPeriod; ++s) {
    size_t best = 0;
    double behind = -1e300;
    for (size_t d = 0; d < n; ++d) {
      const double lag = static_cast<double>((s + 1) * slots_[d]) / static_cast<double>(kPeriod) -
                         static_cast<double>(taken[d]);
      if (taken[d] < slots_[d] && lag > behind) {
        behind = lag;
        best = d;
      }
    }
    order_.push_back(static_cast<int>(best));
    earlier_.push_back(taken[best]++);
  }
}

std::pair<int, int64_t> MixtureSchedule::locate(int64_t i) const {
  const int64_t slot = i % kPeriod;
  const int d = order_[static_cast<size_t>(slot)];
  return {d, i / kPeriod * slots_[static_cast<size_t>(d)] + earlier_[static_cast<size_t>(slot)]};
}

}  // namespace fsdp::data
