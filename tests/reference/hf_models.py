"""Small random models of each family, written by `transformers` itself
(`AutoModelForCausalLM.from_config(...).save_pretrained(dir)`): the
directories fsdp.cpp must load as a user's would be loaded. Sizes are
chosen to run in seconds on two cores while keeping every feature the
family has (grouped-query attention, a tied head, Llama 3's rope scaling,
q/k norms, routed experts).
"""
import torch
import transformers

FAMILIES = ("gpt2", "llama", "llama2", "mistral", "qwen3", "qwen3_moe", "llama4")
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
    if family == "llama2":
        # Llama 2's shape: every head its own key/value (no grouping), no
        # rope scaling, theta 10000, an untied head.
        return transformers.LlamaConfig(**{**decoder, "num_key_value_heads": 4}, rope_theta=10000.0,
                                        tie_word_embeddings=False)
    if family == "llama4":
        # Every Llama 4 layer kind in four: MoE every other layer (top-2 of
        # 4 experts and the shared one), NoPE layers 1 and 3 with
        # temperature tuning, chunked attention and L2 q/k norms on 0 and 2.
        # Chunks of 8 and a temperature floor of 4 act within 32 tokens.
        return transformers.Llama4TextConfig(
            **{**decoder, "intermediate_size": 32, "num_hidden_layers": 4}, head_dim=16, intermediate_size_mlp=128,
            num_local_experts=4, num_experts_per_tok=2, interleave_moe_layer_step=2, no_rope_layers=[1, 0, 1, 0],
            attention_chunk_size=8, attn_temperature_tuning=True, floor_scale=4, attn_scale=0.1, use_qk_norm=True,
            tie_word_embeddings=False,
            rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                 high_freq_factor=4.0, original_max_position_embeddings=16))
    if family == "mistral":
        # Mistral 7B v0.3's form: no sliding window, theta 1e6, untied.
        return transformers.MistralConfig(sliding_window=None, rope_theta=1e6, tie_word_embeddings=False, **decoder)
    if family == "qwen3":
        return transformers.Qwen3Config(head_dim=16, tie_word_embeddings=False, **decoder)
    if family == "qwen3_moe":
        # output_router_logits: the load-balancing loss joins the training
        # loss (transformers' default leaves it out).
        return transformers.Qwen3MoeConfig(head_dim=16, moe_intermediate_size=32, num_experts=4,
                                           num_experts_per_tok=2, norm_topk_prob=True, output_router_logits=True,
                                           **decoder)
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


def write_llama4_multimodal(directory, seed=0):
    """A Llama4ForConditionalGeneration directory around config("llama4")
    with a one-layer vision tower: the form Llama 4's published checkpoints
    take. Returns the model; its text logits are what fsdp.cpp must give."""
    vision = transformers.Llama4VisionConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                             intermediate_size=64, vision_output_dim=64, image_size=28,
                                             patch_size=14, projector_input_dim=64, projector_output_dim=64)
    both = transformers.Llama4Config(text_config=config("llama4").to_dict(), vision_config=vision.to_dict())
    torch.manual_seed(seed)
    model = transformers.Llama4ForConditionalGeneration(both)
    model.save_pretrained(directory)
    return model.eval()
