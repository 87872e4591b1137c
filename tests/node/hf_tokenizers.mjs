// The oracle of the tokenizer tests: Hugging Face's tokenizers.js (and, for GPT-2, the
// gpt-3-encoder package). Reads one JSON request on standard input:
//   {"modules": DIR (where npm installed the packages), "tokenizer": PATH | null, "gpt3_encoder": bool, "texts": [...], "pairs": [[a, b], ...],
//    "add_special_tokens": bool, "decode": [[ids], ...], "skip_special_tokens": bool,
//    "decode_back": bool (also decode the texts' non-empty ids), "repeat": passes over the texts}
// and writes {"texts": [[ids]], "pairs": [[ids]], "decoded": [...], "encode_ms": [ms per pass]}.
// With "requests": [request, ...] (each without modules and tokenizer) the tokenizer is loaded
// once for all of them, and the answer is {"results": [answer, ...]}.
import fs from "fs";
import { createRequire } from "module";
import path from "path";

const request = JSON.parse(fs.readFileSync(0, "utf8"));
const require = createRequire(path.join(request.modules, "node_modules", "oracle.js"));

function answer(tokenizer, r) {
  const add_special_tokens = r.add_special_tokens ?? true;
  const out = {};
  // "repeat": encode the texts that many times, each pass timed (encode_ms: the passes' times).
  out.encode_ms = [];
  for (let pass = 0; pass < (r.repeat ?? 1); ++pass) {
    const start = performance.now();
    out.texts = (r.texts ?? []).map((t) => tokenizer.encode(t, { add_special_tokens }).ids);
    out.encode_ms.push(performance.now() - start);
  }
  out.pairs = (r.pairs ?? []).map(
    ([a, b]) => tokenizer.encode(a, { text_pair: b, add_special_tokens }).ids);
  const to_decode = r.decode_back ? out.texts.filter((ids) => ids.length > 0) : (r.decode ?? []);
  out.decoded = to_decode.map((ids) => ids.length === 0 ? "" :
    tokenizer.decode(ids, {
      skip_special_tokens: r.skip_special_tokens ?? false,
      clean_up_tokenization_spaces: false,
    }));
  return out;
}

let out = {};
if (request.gpt3_encoder) {
  const { encode } = require("gpt-3-encoder");
  const start = performance.now();
  out.texts = (request.texts ?? []).map((t) => encode(t));
  out.encode_ms = performance.now() - start;
} else {
  const { Tokenizer } = require("@huggingface/tokenizers");
  const config = JSON.parse(fs.readFileSync(request.tokenizer, "utf8"));
  const tokenizer = new Tokenizer(config, {});
  out = request.requests ? { results: request.requests.map((r) => answer(tokenizer, r)) }
                         : answer(tokenizer, request);
}
process.stdout.write(JSON.stringify(out));
