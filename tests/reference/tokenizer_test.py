"""`fsdp data prepare` against Hugging Face `tokenizers` (Python) on the
whole demo corpus (data/sotu, scripts/fetch_data.sh): for GPT-2's, Llama
3's and Qwen3's tokenizer.json, the token stream `prepare --val-fraction 0`
writes equals, address by address in file-name order, the document
separator followed by `Tokenizer.encode(text, add_special_tokens=False)`.
"""
import glob
import json
import os

import numpy as np
from tokenizers import Tokenizer

import harness
import token_files

# (tokenizer directory under data/, the separator's token)
TOKENIZERS = {"gpt2-hf": "<|endoftext|>", "llama3": "<|begin_of_text|>", "qwen3": "<|endoftext|>"}


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
        print(f"{name}: {len(documents)} addresses, {offset:,} tokens, equal to tokenizers "
              f"{__import__('tokenizers').__version__}", flush=True)


if __name__ == "__main__":
    main()
