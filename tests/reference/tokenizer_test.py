"""`fsdp data prepare` against Hugging Face `tokenizers` (Python) on the
whole demo corpus (data/sotu, scripts/fetch_data.sh): for GPT-2's, Llama
3's and Qwen3's tokenizer.json (byte-level) and Mistral's (SentencePiece-
style, in Llama 2's format), the token stream `prepare --val-fraction 0`
writes equals, address by address in file-name order, the document
separator followed by `Tokenizer.encode(text, add_special_tokens=False)`.
And `fsdp data decode` gives `Tokenizer.decode(ids, skip_special_tokens=
False)`'s text for the separator and a few whole addresses, and for texts
whose decoding each kind treats specially.
"""
import glob
import json
import os
import subprocess

import numpy as np
import tokenizers
from tokenizers import Tokenizer

import harness
import token_files

# (tokenizer directory under data/, the separator's token)
TOKENIZERS = {"gpt2-hf": "<|endoftext|>", "llama3": "<|begin_of_text|>", "qwen3": "<|endoftext|>", "mistral": "<s>"}

# Leading and repeated spaces (the SentencePiece decoders strip one), a
# character Mistral spells in byte tokens, tabs and newlines, "▁" itself.
DECODED_TEXTS = ["  two leading spaces,   three inside ", "emoji 👋🏽 and 日本語\t\r\n", " \u2581 x\u2581\u2581"]


def decode(args, directory, ids):
    result = subprocess.run([args.fsdp, "data", "decode", "--tokenizer", directory],
                            input=",".join(map(str, ids)).encode(), capture_output=True)
    if result.returncode != 0:
        harness.fail(f"fsdp data decode exited {result.returncode}: {result.stderr.decode(errors='replace')[-2000:]}")
    out = result.stdout.decode("utf-8")
    return out[:-1] if out.endswith("\n") else out


def main():
    args = harness.parse_args(__doc__)
    work = harness.work_dir(args)
    data = os.path.join(harness.SOURCE_DIR, "data")
    documents = sorted(glob.glob(os.path.join(data, "sotu", "*.json")))
    if not documents:
        harness.fail(f"no documents in {data}/sotu (scripts/fetch_data.sh fetches them)")
    texts = [json.load(open(d))["text"] for d in documents]
    for name, separator in TOKENIZERS.items():
        directory = os.path.join(data, name)
        out = os.path.join(work, name)
        harness.run([args.fsdp, "data", "prepare", "--input", os.path.join(data, "sotu"), "--out-dir", out,
                     "--tokenizer", directory, "--val-fraction", "0"])
        ours = token_files.read(os.path.join(out, "train.bin"))
        tokenizer = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
        separator_id = tokenizer.token_to_id(separator)
        encoded = tokenizer.encode_batch(texts, add_special_tokens=False)
        offset = 0
        for path, encoding in zip(documents, encoded):
            expected = np.array([separator_id] + encoding.ids)
            got = ours[offset:offset + len(expected)]
            if not np.array_equal(got, expected):
                first = int(np.argmax(got != expected)) if len(got) == len(expected) else min(len(got), len(expected))
                harness.fail(f"{name}: {os.path.basename(path)} differs from token {first}: fsdp "
                             f"{got[first:first + 8].tolist()}, tokenizers {expected[first:first + 8].tolist()}")
            offset += len(expected)
        if offset != len(ours):
            harness.fail(f"{name}: fsdp wrote {len(ours)} tokens, tokenizers {offset}")
        print(f"{name}: {len(documents)} addresses, {offset:,} tokens, equal to tokenizers {tokenizers.__version__}",
              flush=True)

        samples = [[separator_id] + encoded[k].ids for k in (0, len(documents) // 2, len(documents) - 1)]
        samples += [tokenizer.encode(t, add_special_tokens=False).ids for t in DECODED_TEXTS]
        characters = 0
        for ids in samples:
            expected = tokenizer.decode(ids, skip_special_tokens=False)
            got = decode(args, directory, ids)
            if got != expected:
                first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
                harness.fail(f"{name}: data decode differs from character {first}: fsdp {got[first:first + 40]!r}, "
                             f"tokenizers {expected[first:first + 40]!r}")
            characters += len(expected)
        print(f"{name}: data decode of {len(samples)} token lists ({characters:,} characters) equals tokenizers' decode",
              flush=True)


if __name__ == "__main__":
    main()
