#include "fsdp/common/error_text.h"

#include <c10/util/Exception.h>

namespace fsdp {

std::string error_text(const std::exception& e) {
  std::string text;
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    text = c10_error->what_without_backtrace();
  } else {
    text = e.what();
  }
  // Keep the first line: the rest is context meant for developers of LibTorch.
  const auto nl = text.find('\n');
  if (nl != std::string::npos) text.resize(nl);
  return text;
}

}  // namespace fsdp
