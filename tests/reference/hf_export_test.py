"""An export is a model `transformers` can use, judged by `transformers`.

For each family, a source directory as a user has one: a small random model
written by transformers with a real tokenizer (data/, scripts/fetch_data.sh)
and its special-token ids, generation_config.json and a chat template.
`fsdp train --init-from SOURCE --export-hf OUT` trains one step; then

  - OUT carries the ids, generation_config.json, the chat template and the
    tokenizer files (compared with the source's bytes and values);
  - AutoTokenizer loads OUT with the source's vocabulary, encodes a text as
    the source's tokenizer does and renders the chat template the same;
  - AutoModelForCausalLM loads OUT with the source's end-of-text id, and its
    greedy text from a prompt equals `fsdp generate --temperature 0`'s;
  - `fsdp ckpt export` of the run's checkpoint writes the same companions.

And the README demo's case: a GPT-2 preset trained on GPT-2's BPE files
(data/gpt2, no tokenizer.json) exports vocab.json and merges.txt that
AutoTokenizer reads as GPT-2's tokenizer (50,257 tokens, "hello world" as
[31373, 995]), with <|endoftext|> (50256) as the ids; and with its
generation_config.json's eos_token_id set to a token greedy decoding
reaches, transformers' `generate` and `fsdp generate` both stop there, with
the same text.
"""
import json
import os
import shutil
import subprocess

import torch
import transformers
from tokenizers import Tokenizer

import harness
import hf_models
import token_files

DATA = os.path.join(harness.SOURCE_DIR, "data")
# family -> tokenizer directory under data/
FAMILIES = {"gpt2": "gpt2-hf", "llama": "llama3", "llama2": "mistral", "qwen3": "qwen3", "qwen3_moe": "qwen3",
            "llama4": "llama3"}
CHAT_TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
PROMPT = "The quick brown fox"
TEXT = "Hello world, 日本語 and emoji 👋!"
NEW_TOKENS = 12


def special_ids(tokenizer_dir):
    config = json.load(open(os.path.join(tokenizer_dir, "tokenizer_config.json")))
    tokenizer = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))

    def content(value):
        return value.get("content") if isinstance(value, dict) else value

    ids = {}
    for role in ("bos", "eos"):
        text = content(config.get(f"{role}_token"))
        if text:
            ids[f"{role}_token_id"] = tokenizer.token_to_id(text)
    return ids, tokenizer.get_vocab_size(with_added_tokens=True)


def write_source(family, tokenizer_dir, directory):
    ids, vocab = special_ids(tokenizer_dir)
    config = hf_models.config(family)
    config.vocab_size = vocab
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(config, key, ids.get(key))
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokenizer_dir, name), directory)
    transformers.GenerationConfig(**ids, max_new_tokens=77, do_sample=False).save_pretrained(directory)
    with open(os.path.join(directory, "chat_template.jinja"), "w") as f:
        f.write(CHAT_TEMPLATE)
    return ids, vocab


def same_bytes(a, b):
    return open(a, "rb").read() == open(b, "rb").read()


def fsdp_greedy(args, directory, stop_at_eos=False):
    """`fsdp generate`'s text: its bytes as written (a byte-level token may end
    inside a character), decoded as transformers decodes, invalid bytes
    replaced."""
    command = [args.fsdp, "generate", "--from", directory, "--prompt", PROMPT, "--temperature", "0",
               "--max-new-tokens", str(NEW_TOKENS)] + ([] if stop_at_eos else ["--ignore-eos"])
    result = subprocess.run(command, capture_output=True)
    if result.returncode != 0:
        harness.fail(f"{' '.join(command)} exited {result.returncode}: {result.stderr.decode(errors='replace')}")
    out = result.stdout.decode("utf-8", errors="replace")
    return out[:-1] if out.endswith("\n") else out


def transformers_greedy(directory, stop_at_eos=False):
    """transformers' greedy text and model; without stop_at_eos exactly
    NEW_TOKENS tokens, as `fsdp generate --ignore-eos` writes."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    prompt = tokenizer(PROMPT, add_special_tokens=False, return_tensors="pt")["input_ids"]
    least = {} if stop_at_eos else {"min_new_tokens": NEW_TOKENS}
    out = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, **least)
    model.generated = out[0, prompt.shape[1]:].tolist()
    return tokenizer.decode(out[0], skip_special_tokens=False), model


def check_export(args, family, source, out, ids, vocab):
    config = json.load(open(os.path.join(out, "config.json")))
    for key, value in ids.items():
        harness.check(f"{family}: config.json {key} is the source's ({value})", int(config.get(key) != value), 0)
    for name in ("generation_config.json", "chat_template.jinja", "tokenizer.json", "tokenizer_config.json"):
        present = os.path.exists(os.path.join(out, name)) and same_bytes(os.path.join(source, name),
                                                                          os.path.join(out, name))
        harness.check(f"{family}: {name} carried over unchanged", int(not present), 0)
    theirs = transformers.AutoTokenizer.from_pretrained(source)
    ours = transformers.AutoTokenizer.from_pretrained(out)
    harness.check(f"{family}: AutoTokenizer's vocabulary ({len(theirs)})", int(len(ours) != len(theirs)), 0)
    harness.check(f"{family}: AutoTokenizer encodes as the source's", int(ours(TEXT)["input_ids"] !=
                                                                          theirs(TEXT)["input_ids"]), 0)
    messages = [{"role": "user", "content": "hi"}]
    harness.check(f"{family}: the chat template renders as the source's",
                  int(ours.apply_chat_template(messages, tokenize=False) !=
                      theirs.apply_chat_template(messages, tokenize=False)), 0)


def main():
    args = harness.parse_args(__doc__)
    missing = [d for d in list(FAMILIES.values()) + ["gpt2"] if not os.path.isdir(os.path.join(DATA, d))]
    if missing:
        print(f"SKIP: data/{missing[0]} is missing (scripts/fetch_data.sh fetches it)")
        raise SystemExit(77)
    work = harness.work_dir(args)
    for family, tokenizer_name in FAMILIES.items():
        source, run = os.path.join(work, family), os.path.join(work, family + "-run")
        ids, vocab = write_source(family, os.path.join(DATA, tokenizer_name), source)
        tokens = os.path.join(work, family + ".bin")
        token_files.write(tokens, token_files.learnable_stream(4096, min(vocab, 1000)))
        harness.run([args.fsdp, "train", "--init-from", source, "--data", tokens, "--steps", "1", "--seq-len", "16",
                     "--batch-size", "2", "--out-dir", run, "--tensorboard=false", "--save-every", "1",
                     "--export-hf", os.path.join(run, "hf")])
        out = os.path.join(run, "hf")
        check_export(args, family, source, out, ids, vocab)
        text, model = transformers_greedy(out)
        harness.check(f"{family}: generation_config's eos_token_id is the source's",
                      int(model.generation_config.eos_token_id != ids.get("eos_token_id")), 0)
        ours = fsdp_greedy(args, out)
        if ours != text:
            harness.fail(f"{family}: greedy text differs:\n  fsdp generate: {ours!r}\n  transformers:  {text!r}")
        print(f"{family}: greedy text equal: {text!r}", flush=True)
        exported = os.path.join(run, "from-ckpt")
        harness.run([args.fsdp, "ckpt", "export", os.path.join(run, "checkpoints"), exported])
        for name in sorted(os.listdir(out)):
            if name.endswith(".safetensors"):
                continue
            harness.check(f"{family}: ckpt export's {name} equals --export-hf's",
                          int(not same_bytes(os.path.join(out, name), os.path.join(exported, name))), 0)

    # The README demo's case: GPT-2's BPE files, no tokenizer.json.
    run = os.path.join(work, "demo")
    harness.run([args.fsdp, "train", "--model", "gpt2-mini", "--data", "synthetic", "--steps", "1", "--seq-len", "16",
                 "--batch-size", "2", "--out-dir", run, "--tensorboard=false", "--tokenizer",
                 os.path.join(DATA, "gpt2"), "--export-hf", os.path.join(run, "hf")])
    out = os.path.join(run, "hf")
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    harness.check("gpt2-mini: AutoTokenizer's vocabulary is GPT-2's 50257", int(len(tokenizer) != 50257), 0)
    harness.check("gpt2-mini: 'hello world' is [31373, 995]", int(tokenizer("hello world")["input_ids"] != [31373, 995]),
                  0)
    config = json.load(open(os.path.join(out, "config.json")))
    generation = json.load(open(os.path.join(out, "generation_config.json")))
    harness.check("gpt2-mini: <|endoftext|> (50256) ends a text in config.json and generation_config.json",
                  int((config["eos_token_id"], generation["eos_token_id"], tokenizer.eos_token_id) !=
                      (50256, 50256, 50256)), 0)
    text, model = transformers_greedy(out)
    ours = fsdp_greedy(args, out)
    if ours != text:
        harness.fail(f"gpt2-mini: greedy text differs:\n  fsdp generate: {ours!r}\n  transformers:  {text!r}")
    print("gpt2-mini: greedy text equal", flush=True)

    # Both stop at the end-of-text id: made the fourth greedy token's, so
    # that this random model reaches it.
    eos = model.generated[3]
    generation["eos_token_id"] = eos
    json.dump(generation, open(os.path.join(out, "generation_config.json"), "w"))
    text, model = transformers_greedy(out, stop_at_eos=True)
    harness.check("gpt2-mini: transformers stops at the end-of-text id", int(model.generated[-1] != eos or
                                                                               len(model.generated) >= NEW_TOKENS), 0)
    ours = fsdp_greedy(args, out, stop_at_eos=True)
    if ours != text:
        harness.fail(f"gpt2-mini: text up to the end-of-text id differs:\n  fsdp generate: {ours!r}\n"
                     f"  transformers:  {text!r}")
    print(f"gpt2-mini: both stop at the end-of-text id {eos}: {text!r}", flush=True)


if __name__ == "__main__":
    main()
