#pragma once
// "Did you mean ...?" for unknown names. Light header: no LibTorch.

#include <string>
#include <vector>

namespace fsdp {

size_t edit_distance(const std::string& a, const std::string& b);
// "; did you mean 'x'?" for the closest candidate, or "" if none is close.
std::string did_you_mean(const std::string& name, const std::vector<std::string>& candidates);
std::string join_words(const std::vector<std::string>& words, const std::string& sep = ", ");

}  // namespace fsdp
