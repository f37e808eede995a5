// A chat template from a downloaded tokenizer: refused with fsdp::Error
// (outside the subset, or past a bound of kMaxTemplateBytes,
// kMaxRenderBytes, kMaxLoopIterations, kMaxValueNesting), or parsed and
// rendered over a two-turn conversation. Never a crash, a hang past the
// fuzzer's per-input timeout, or memory past its limit.

#include <cstdint>
#include <string>

#include "fsdp/common/error.h"
#include "fsdp/data/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  try {
    const fsdp::data::ChatTemplate chat(source);
    nlohmann::ordered_json context;
    context["messages"] = nlohmann::ordered_json::array(
        {{{"role", "user"}, {"content", "What is 2+2?"}}, {{"role", "assistant"}, {"content", "4"}}});
    context["add_generation_prompt"] = true;
    context["bos_token"] = "<s>";
    context["eos_token"] = "</s>";
    (void)chat.render(context);
  } catch (const fsdp::Error&) {
  }
  return 0;
}
