#pragma once
// The message of an exception from c10d, Gloo or LibTorch, without the C++
// backtrace that c10::Error carries (users get one line, not a stack dump).

#include <exception>
#include <string>

namespace fsdp {

std::string error_text(const std::exception& e);

}  // namespace fsdp
