// What fsdp.cpp computes for a Hugging Face directory, written for the
// reference tests to compare with `transformers`:
//
//   fsdp_logits_probe DIR IN.safetensors OUT.safetensors NEW_TOKENS
//
// IN holds `input_ids` (B, T) int64. OUT gets `logits` (B, T, V) fp32 from
// one forward of the loaded model, and `greedy` (B, NEW_TOKENS) int64: the
// tokens `fsdp generate --temperature 0` appends to each row.
#include <cstdio>
#include <string>
#include <vector>

#include "fsdp/common/error.h"
#include "fsdp/io/safetensors.h"
#include "fsdp/models/hf/weights.h"
#include "fsdp/train/generate.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s DIR IN.safetensors OUT.safetensors NEW_TOKENS\n", argv[0]);
    return 2;
  }
  try {
    const auto model = fsdp::models::load_hf_pretrained(argv[1]);
    model->eval();
    const fsdp::io::SafetensorsFile in(argv[2]);
    const at::Tensor ids = in.view("input_ids").to(at::kLong).clone();
    at::Tensor logits;
    {
      torch::NoGradGuard no_grad;
      logits = model->forward(ids).matmul(model->output_weight().t()).to(at::kFloat).contiguous();
    }
    fsdp::train::SampleOptions greedy;
    greedy.temperature = 0;
    greedy.max_new_tokens = std::stoll(argv[4]);
    std::vector<at::Tensor> rows;
    for (int64_t b = 0; b < ids.size(0); ++b) {
      const auto row = ids[b].to(at::kInt).contiguous();
      const std::vector<int32_t> prompt(row.data_ptr<int32_t>(), row.data_ptr<int32_t>() + row.numel());
      const auto out = fsdp::train::generate(model, prompt, greedy);
      rows.push_back(at::tensor(std::vector<int64_t>(out.begin(), out.end()), at::kLong));
    }
    fsdp::io::write_safetensors(argv[3], {{"logits", logits}, {"greedy", at::stack(rows)}});
  } catch (const fsdp::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
