#include "fsdp/train/generate.h"

#include <algorithm>

#include "fsdp/common/error.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/models/kv_cache.h"

namespace fsdp::train {

std::vector<int32_t> generate(const models::CausalLM& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& o) {
  FSDP_CHECK(!prompt.empty(), "generate: the prompt has no tokens");
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  std::vector<int32_t> out;
  const int64_t window = model->max_seq_len();
  // With a key/value cache each token after the prompt runs alone; past the
  // model's positions the text slides through the window and every token
  // runs the whole window again, as without one.
  // Room for what this call can hold: a model's positions may be far more
  // (Llama 3's 131,072 would be gigabytes of keys and values per layer).
  models::KvCache cache;
  cache.capacity = std::min<int64_t>(window, static_cast<int64_t>(prompt.size()) + o.max_new_tokens);
  struct Detach {
    models::CausalLMImpl& m;
    ~Detach() { m.kv_cache = nullptr; }
  } detach{*model};
  const auto device = model->output_weight().device();
  for (int64_t i = 0; i < o.max_new_tokens; ++i) {
    const bool cached = model->supports_kv_cache() && static_cast<int64_t>(ids.size()) <= window;
    model->kv_cache = cached ? &cache : nullptr;
    // The model sees at most its context window: the last max_seq_len tokens.
    const int64_t context = std::min<int64_t>(static_cast<int64_t>(ids.size()), window);
    const int64_t fed = cached ? static_cast<int64_t>(ids.size()) - cache.length : context;
    auto tokens = torch::tensor(std::vector<int64_t>(ids.end() - fed, ids.end()), torch::kLong).unsqueeze(0).to(device);
    // The head uses the root's parameters, gathered only inside the root's call.
    auto logits = fsdp::run(model, [&] {
                    auto hidden = model->forward(tokens);  // (1, fed, C)
                    return hidden.select(1, fed - 1).matmul(model->output_weight().t());
                  }).to(torch::kCPU, torch::kFloat).squeeze(0);  // sampled on the host, with `gen`
    if (cached) cache.length += fed;
    int64_t next;
    if (o.temperature <= 0) {
      next = logits.argmax().item<int64_t>();
    } else {
      logits = logits / o.temperature;
      if (o.top_k > 0 && o.top_k < logits.size(0)) {
        const auto kth = std::get<0>(logits.topk(o.top_k)).min();
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
      }
      if (o.top_p < 1.0) {
        // Drop a token when the likelier ones alone already reach top_p.
        const auto [sorted, order] = logits.sort(/*dim=*/-1, /*descending=*/true);
        const auto probs = sorted.softmax(-1);
        const auto before = probs.cumsum(-1) - probs;
        const auto dropped = torch::zeros_like(logits, torch::kBool).scatter(0, order, before >= o.top_p);
        logits = logits.masked_fill(dropped, -std::numeric_limits<float>::infinity());
      }
      next = torch::multinomial(logits.softmax(-1), 1, false, gen).item<int64_t>();
    }
    ids.push_back(next);
    out.push_back(static_cast<int32_t>(next));
    if (std::find(o.stop_ids.begin(), o.stop_ids.end(), next) != o.stop_ids.end()) break;
    if (o.stop_when && o.stop_when(out)) break;
  }
  if (was_training) model->train();
  return out;
}

}  // namespace fsdp::train
