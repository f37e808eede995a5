#pragma once
// Chat and instruction data as training examples: a record's tokens under
// the model's own chat template, and which of them the loss covers.
// Light header: no LibTorch.
//
// Records (one JSON object each, as TRL's SFTTrainer reads them):
//   {"messages": [{"role": ..., "content": ...}, ...]}  a conversation: the
//       loss covers each assistant message;
//   {"prompt": [...messages], "completion": [...messages]}  a conversational
//       pair, and {"prompt": "...", "completion": "..."} a plain one: the
//       loss covers the completion.
//   {"prompt": ..., "chosen": ..., "rejected": ...}  preference data (TRL's
//       DPOTrainer's, conversational or plain): two examples, prompt +
//       chosen and prompt + rejected, each encoded as a pair is; both
//       train from where the first of the two parts from the prompt alone,
//       as TRL takes the shorter common prefix.
// Optional "tools" and "chat_template_kwargs" (enable_thinking, ...) are
// handed to the template, as transformers' apply_chat_template does.
//
// [Note: where an answer's loss starts]
// - A pair (TRL's completion_only_loss): the prompt alone is tokenized
//   (under the template with add_generation_prompt, or plain), then prompt
//   and completion together; the loss starts where the two token lists
//   part, and runs to the end. A plain pair gets the tokenizer's eos_token
//   appended to its completion (unless it ends with it) and the tokens
//   add_special_tokens puts before a text (Llama's BOS), as TRL does.
// - A conversation: assistant message k's loss starts where the template's
//   rendering of the messages before it, with add_generation_prompt, ends
//   (when that text does not begin the whole conversation's rendering, as
//   Mistral's tools, written before the last user message only, make
//   earlier answers, the answer is left out of the loss: the model is
//   trained to continue only what it sees when it generates), and runs
//   through the tokenizer's eos_token or the first special token after the
//   answer's text, whichever comes first (<|im_end|>, <|eot_id|>, </s>; a
//   tool call's opening [TOOL_CALLS] is the answer's), and the whitespace
//   tokens that follow it: the whole assistant turn, as TRL trains it. The
//   answer's text is found in the rendering after its prompt, so special
//   tokens inside it ("Arr, hello <|persona|>!") are the answer's too;
//   where the template renders the content otherwise (stripped, split),
//   the turn ends at the first special token after its text began. A conversation none of whose answers
//   can be trained is refused.

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/data/chat_template.h"
#include "fsdp/data/tokenizer.h"

namespace fsdp::data {

struct Example {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> trained;  // 1 where predicting the token counts in the loss
  // Assistant messages the loss leaves out: the template renders what
  // precedes them otherwise when it generates them (see below).
  int64_t answers_left_out = 0;
};

// Whether a JSON record is chat data (it has "messages", or "prompt" and
// "completion", or "prompt", "chosen" and "rejected") rather than a text
// field.
bool is_chat_record(const nlohmann::ordered_json& record);
// Whether a record is preference data ("chosen" and "rejected").
bool is_preference_record(const nlohmann::ordered_json& record);

class ChatEncoder {
 public:
  // The template of the tokenizer's directory (chat_template_source);
  // throws when it has none or the renderer refuses it. Plain pairs need
  // no template: `require_template` false leaves it unread.
  ChatEncoder(const std::string& tokenizer_dir, const Tokenizer& tokenizer, bool require_template = true);
  ~ChatEncoder();

  // One record as an example, tokenized by `tokenizer` (a clone of the one
  // given above, for another thread). Throws fsdp::Error starting with
  // WHERE for a record that is not chat data of a kind above, a role the
  // template does not know, and a template that raises.
  Example encode(const nlohmann::ordered_json& record, const Tokenizer& tokenizer, const std::string& where) const;
  // A preference record as its two examples, chosen then rejected.
  std::array<Example, 2> encode_preference(const nlohmann::ordered_json& record, const Tokenizer& tokenizer,
                                           const std::string& where) const;

  // The template's text for MESSAGES (for `fsdp generate --chat`).
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  bool has_template() const { return template_ != nullptr; }

 private:
  nlohmann::ordered_json context(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& record) const;
  std::unique_ptr<ChatTemplate> template_;
  std::string template_where_;
  nlohmann::ordered_json special_tokens_;  // bos_token, eos_token, ... by name
  std::vector<int32_t> prefix_;            // the tokens add_special_tokens puts before a text
  std::string eos_;
  int32_t eos_id_ = -1;  // the eos_token's id, when it is one token
};

}  // namespace fsdp::data
