// The reference of zeroth's byte-level BPE tokenizer (tests/train/bpe_tokenizer_test.cc):
// Hugging Face's own tokenizers.js (npm @huggingface/tokenizers, which tools/install-deps.sh puts
// in .cache/node), run by the machine's node.
//
//   node bpe_reference.mjs train TEXT OUT.json MERGES
//     learns MERGES byte-level BPE merges from TEXT, its words split by Llama 3's pattern through
//     tokenizers.js's own Split and ByteLevel pre-tokenizers, and writes a tokenizer.json in
//     Llama 3's form (Split + ByteLevel pre-tokenizer, ByteLevel decoder, ignore_merges, special
//     added tokens) with an NFC normalizer, as Qwen2's has;
//   node bpe_reference.mjs encode TOKENIZER.json INPUTS.json
//     prints, for each string of the JSON array INPUTS, {"ids": [...], "text": decode(ids)}, as
//     one JSON array (no special tokens added; added tokens in the text are recognized);
//   node bpe_reference.mjs decode TOKENIZER.json IDS.json
//     prints decode(ids) of each id list of the JSON array IDS, as one JSON array.
//
// ZEROTH_NODE_MODULES names the node_modules folder that holds the package.
import fs from "node:fs";
import path from "node:path";

const modules = process.env.ZEROTH_NODE_MODULES;
if (!modules) throw new Error("set ZEROTH_NODE_MODULES to the node_modules folder holding @huggingface/tokenizers");
const hf = await import(path.resolve(modules, "@huggingface/tokenizers/dist/tokenizers.mjs"));

// Llama 3's pre-tokenizer split pattern, as its tokenizer.json holds it.
const LLAMA3_PATTERN =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const PRE_TOKENIZER = {
  type: "Sequence",
  pretokenizers: [
    { type: "Split", pattern: { Regex: LLAMA3_PATTERN }, behavior: "Isolated", invert: false },
    { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false },
  ],
};

// GPT-2's printable stand-ins for the 256 byte values, in byte order.
function byteChars() {
  const printable = [];
  for (let b = 33; b <= 126; ++b) printable.push(b);
  for (let b = 161; b <= 172; ++b) printable.push(b);
  for (let b = 174; b <= 255; ++b) printable.push(b);
  const out = new Array(256);
  let extra = 0;
  for (let b = 0; b < 256; ++b) out[b] = String.fromCodePoint(printable.includes(b) ? b : 256 + extra++);
  return out;
}

function train(textPath, outPath, merges) {
  const text = fs.readFileSync(textPath, "utf8").normalize("NFC");
  const pre = new hf.SequencePreTokenizer(PRE_TOKENIZER);
  const counts = new Map();
  for (const line of text.split(/(?<=\n)/)) {
    for (const w of pre.pre_tokenize_text(line)) counts.set(w, (counts.get(w) ?? 0) + 1);
  }
  const symbols = byteChars();
  const vocab = new Map(symbols.map((s, i) => [s, i]));
  const words = [...counts].map(([w, n]) => ({ syms: [...w].map((c) => vocab.get(c)), n }));
  for (const w of words) if (w.syms.includes(undefined)) throw new Error("a pre-tokenized word holds a character that is no byte");
  const key = (a, b) => `${a},${b}`;
  const pairs = new Map(); // key -> {a, b, n, where: Set of word indices}
  const add = (a, b, n, i) => {
    const k = key(a, b);
    let p = pairs.get(k);
    if (!p) pairs.set(k, (p = { a, b, n: 0, where: new Set() }));
    p.n += n;
    p.where.add(i);
  };
  words.forEach((w, i) => { for (let j = 0; j + 1 < w.syms.length; ++j) add(w.syms[j], w.syms[j + 1], w.n, i); });
  const learned = [];
  while (learned.length < merges) {
    let best = null;
    for (const p of pairs.values()) {
      if (p.n <= 0) continue;
      if (!best || p.n > best.n || (p.n === best.n && (symbols[p.a] + " " + symbols[p.b]) < (symbols[best.a] + " " + symbols[best.b])))
        best = p;
    }
    if (!best || best.n < 2) break;
    const merged = symbols[best.a] + symbols[best.b];
    const id = symbols.length;
    symbols.push(merged);
    vocab.set(merged, id);
    learned.push([symbols[best.a], symbols[best.b]]);
    for (const i of [...best.where]) {
      const w = words[i];
      for (let j = 0; j + 1 < w.syms.length; ++j) pairs.get(key(w.syms[j], w.syms[j + 1])).n -= w.n;
      const next = [];
      for (let j = 0; j < w.syms.length; ++j) {
        if (j + 1 < w.syms.length && w.syms[j] === best.a && w.syms[j + 1] === best.b) {
          next.push(id);
          ++j;
        } else {
          next.push(w.syms[j]);
        }
      }
      w.syms = next;
      for (let j = 0; j + 1 < w.syms.length; ++j) add(w.syms[j], w.syms[j + 1], w.n, i);
    }
  }
  // A word the merges never build, as Llama 3's vocabulary holds some: with ignore_merges it is
  // one token when it stands whole.
  symbols.push("Ġqwerty");
  const special = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"];
  const json = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: [
      ...special.map((content, k) => ({ id: symbols.length + k, content, single_word: false, lstrip: false, rstrip: false,
                                        normalized: false, special: true })),
      // An added word that is not special: recognized in text, decoded as it is.
      { id: symbols.length + special.length, content: "zeroth", single_word: false, lstrip: false, rstrip: false, normalized: true,
        special: false },
      // A mask token that takes the whitespace on both sides into it.
      { id: symbols.length + special.length + 1, content: "<mask>", single_word: false, lstrip: true, rstrip: true, normalized: false,
        special: true },
    ],
    normalizer: { type: "NFC" },
    pre_tokenizer: PRE_TOKENIZER,
    post_processor: { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    // As Hugging Face writes a byte-level BPE: "" for the subword prefix and suffix.
    model: {
      type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "", fuse_unk: false,
      byte_fallback: false, ignore_merges: true, vocab: Object.fromEntries(symbols.map((s, i) => [s, i])), merges: learned,
    },
  };
  fs.writeFileSync(outPath, JSON.stringify(json));
  console.log(`${outPath}: ${learned.length} merges, vocabulary ${symbols.length + special.length + 2}`);
}

function encode(tokenizerPath, inputsPath) {
  const json = JSON.parse(fs.readFileSync(tokenizerPath, "utf8"));
  const tokenizer = new hf.Tokenizer(json, { clean_up_tokenization_spaces: false });
  const inputs = JSON.parse(fs.readFileSync(inputsPath, "utf8"));
  const out = inputs.map((s) => {
    const ids = tokenizer.encode(s, { add_special_tokens: false }).ids;
    // tokenizers.js refuses to decode no ids at all
    const text = ids.length > 0 ? tokenizer.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) : "";
    return { ids, text };
  });
  process.stdout.write(JSON.stringify(out));
}

function decode(tokenizerPath, idsPath) {
  const json = JSON.parse(fs.readFileSync(tokenizerPath, "utf8"));
  const tokenizer = new hf.Tokenizer(json, { clean_up_tokenization_spaces: false });
  const lists = JSON.parse(fs.readFileSync(idsPath, "utf8"));
  process.stdout.write(JSON.stringify(lists.map((ids) => tokenizer.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }))));
}

const [mode, ...rest] = process.argv.slice(2);
if (mode === "train" && rest.length === 3) train(rest[0], rest[1], Number(rest[2]));
else if (mode === "encode" && rest.length === 2) encode(rest[0], rest[1]);
else if (mode === "decode" && rest.length === 2) decode(rest[0], rest[1]);
else throw new Error("usage: bpe_reference.mjs train TEXT OUT.json MERGES | encode|decode TOKENIZER.json INPUTS.json");
