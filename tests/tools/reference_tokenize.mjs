// The reference encoders the tokenizer tests compare with, run by Node.js:
//   node reference_tokenize.mjs hf DIR TEXTS.json        @huggingface/tokenizers on DIR/tokenizer.json
//   node reference_tokenize.mjs llama3-js - TEXTS.json   llama3-tokenizer-js (its own vocabulary and encoder)
//   node reference_tokenize.mjs gpt2-js DIR TEXTS.json   DIR/Encoder.js, OpenAI's encoder.py ported (gpt-3-encoder)
// TEXTS.json is a JSON list of strings; prints one line of comma-separated
// ids per string, without template tokens (BOS/EOS). The packages are in
// data/reference-tokenizers and data/gpt2 (scripts/fetch_data.sh).
import fs from "fs";
import { createRequire } from "module";
import path from "path";
import { pathToFileURL } from "url";

const [mode, dir, textsPath] = process.argv.slice(2);
const modules = path.join(path.dirname(new URL(import.meta.url).pathname), "../../data/reference-tokenizers");
const texts = JSON.parse(fs.readFileSync(textsPath, "utf8"));

let encode;
if (mode === "hf") {
  const { Tokenizer } = await import(pathToFileURL(path.join(modules, "@huggingface/tokenizers/dist/tokenizers.mjs")));
  const read = (file) => JSON.parse(fs.readFileSync(path.join(dir, file), "utf8"));
  const config = fs.existsSync(path.join(dir, "tokenizer_config.json")) ? read("tokenizer_config.json") : {};
  const tokenizer = new Tokenizer(read("tokenizer.json"), config);
  encode = (text) => tokenizer.encode(text, { add_special_tokens: false }).ids;
} else if (mode === "llama3-js") {
  const module = await import(
    pathToFileURL(path.join(modules, "llama3-tokenizer-js/bundle/llama3-tokenizer-with-baked-data.js")));
  encode = (text) => module.default.encode(text, { bos: false, eos: false });
} else if (mode === "gpt2-js") {
  const encoder = createRequire(import.meta.url)(path.resolve(dir, "Encoder.js"));
  encode = (text) => encoder.encode(text);
} else {
  throw new Error(`unknown mode '${mode}' (expected hf, llama3-js or gpt2-js)`);
}
for (const text of texts) console.log(encode(text).join(","));
