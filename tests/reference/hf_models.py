"""Small random models of each family, written by `transformers` itself
(`AutoModelForCausalLM.from_config(...).save_pretrained(dir)`): the
directories fsdp.cpp must load as a user's would be loaded. Sizes are
chosen to run in seconds on two cores while keeping every feature the
family has (grouped-query attention, a tied head, Llama 3's rope scaling,
q/k norms, routed experts).
"""
import torch
import transformers

FAMILIES = ("gpt2", "llama", "qwen3", "qwen3_moe")
VOCAB = 512


def config(family):
    # Weights ten times larger than transformers' default (0.02) give
    # logits far enough from uniform that greedy tokens vary.
    common = dict(vocab_size=VOCAB, initializer_range=0.2)
    if family == "gpt2":
        return transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=128, resid_pdrop=0.0,
                                       embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=VOCAB - 1,
                                       eos_token_id=VOCAB - 1, **common)
    decoder = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=128, **common)
    if family == "llama":
        # Llama 3.2's shape: a tied head and rope scaling of type llama3.
        # original_max_position_embeddings is small so that the scaling
        # changes frequencies a 32-token sequence actually uses.
        return transformers.LlamaConfig(
            tie_word_embeddings=True, rope_theta=500000.0,
            rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                              original_max_position_embeddings=16), **decoder)
    if family == "qwen3":
        return transformers.Qwen3Config(head_dim=16, tie_word_embeddings=False, **decoder)
    if family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(head_dim=16, moe_intermediate_size=32, num_experts=4,
                                           num_experts_per_tok=2, norm_topk_prob=True, **decoder)
    raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")


def write_model(family, directory, seed=0):
    """Writes DIRECTORY (config.json, model.safetensors) and returns the model, in fp32."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config(family), dtype=torch.float32)
    model.save_pretrained(directory)
    return model.eval()


def load_model(directory, dtype=torch.float32):
    """The model in DIRECTORY and transformers' loading report (missing,
    unexpected and mismatched keys)."""
    model, info = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype,
                                                                     output_loading_info=True)
    return model.eval(), info
