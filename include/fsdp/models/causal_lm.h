#pragma once
// What the trainer needs from a language model, whatever its family: hidden
// states from tokens, the output projection (tied or not), the blocks that
// become FSDP units, and activation checkpointing per block. Model code is
// single-device; parallelism is applied afterwards (parallelize.h).

#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "fsdp/models/kv_cache.h"

namespace fsdp::models {

struct CausalLMImpl : torch::nn::Module {
  ~CausalLMImpl() override = default;

  // (B, T) int64 tokens -> (B, T, C) hidden states after the final norm.
  virtual torch::Tensor forward(torch::Tensor tokens) = 0;
  // (vocab, C): logits = hidden @ output_weight()^T.
  virtual torch::Tensor output_weight() = 0;
  // The repeated blocks, in order: the units FSDP shards one by one.
  virtual std::vector<std::shared_ptr<torch::nn::Module>> blocks() = 0;
  // The modules a size-based wrap policy may make units, children before
  // their parents: each is called through fsdp::call on every rank in
  // every forward. Default: the blocks.
  virtual std::vector<std::shared_ptr<torch::nn::Module>> wrap_candidates() { return blocks(); }
  // Recompute each block in backward instead of keeping its activations.
  virtual void set_activation_checkpointing(bool enabled) = 0;

  // The registry's family name (family.h), which holds the Hugging Face adapter.
  virtual std::string family() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_seq_len() const = 0;
  virtual int64_t dim() const = 0;
  virtual int64_t n_layers() const = 0;
  // Parameters one token's forward uses (Mixture-of-Experts models use
  // only their routed experts): the N of 6N FLOPs per token.
  virtual int64_t active_parameter_count() const;
  // A loss the model adds to the language-model loss, from its last forward
  // with gradients (the MoE load-balancing loss, already scaled by its
  // coefficient); undefined when it has none.
  virtual torch::Tensor auxiliary_loss() { return {}; }

  // The dtype its Hugging Face weights came in (safetensors spelling: F32,
  // BF16, F16): what export writes unless told otherwise.
  std::string hf_dtype = "F32";

  // Whether forward reads `kv_cache` (kv_cache.h); generation falls back to
  // running the whole text for each token where it does not.
  virtual bool supports_kv_cache() const { return false; }
  // Set by generation around its forwards; null otherwise (training).
  KvCache* kv_cache = nullptr;
  // Whether forward reads packed rows (packed_rows.h: positions restarting
  // at each example, attention kept inside it) when a scope sets them.
  virtual bool supports_packed_rows() const { return false; }
};

using CausalLM = std::shared_ptr<CausalLMImpl>;

// Parameters with tied ones once.
int64_t count_parameters(const torch::nn::Module& model);

}  // namespace fsdp::models
