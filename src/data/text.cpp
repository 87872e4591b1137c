// Text for language models: UTF-8 decoded into a vocabulary of code points (charlm), or token ids
// of a tokenizer (lm), split into chunks.
#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "data/splits.hpp"
#include "io/file_util.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/core/hash.hpp"
#include "seqforge/data/datasets.hpp"
#include "seqforge/io/csv.hpp"
#include "seqforge/text/tokenizer.hpp"

namespace seqforge {

std::u32string decode_utf8(std::string_view text, const std::string& what) {
  std::u32string out;
  out.reserve(text.size());
  const auto* b = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = b[i];
    int more = 0;
    char32_t cp = 0, min = 0;
    if (c < 0x80) {
      cp = c;
    } else if ((c & 0xe0) == 0xc0) {
      more = 1, cp = c & 0x1f, min = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
      more = 2, cp = c & 0x0f, min = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
      more = 3, cp = c & 0x07, min = 0x10000;
    } else {
      fail(what, ": byte ", i, ": not UTF-8 text (a byte ", int(c), " cannot start a character)");
    }
    for (int k = 1; k <= more; ++k) {
      if (i + k >= n) fail(what, ": byte ", i, ": a UTF-8 character cut short at the end");
      if ((b[i + k] & 0xc0) != 0x80)
        fail(what, ": byte ", i, ": not UTF-8 text (a character cut short)");
      cp = (cp << 6) | (b[i + k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      fail(what, ": byte ", i, ": not UTF-8 text (an overlong, surrogate or out-of-range code)");
    out.push_back(cp);
    i += 1 + more;
  }
  return out;
}

std::string encode_utf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char32_t cp : text) io::append_utf8(out, cp);
  return out;
}

std::string shown_character(char32_t c) {
  std::string shown = io::quoted(encode_utf8(std::u32string(1, c)));
  if (c > 0x20 && c < 0x7f) return shown;
  char code[16];
  std::snprintf(code, sizeof code, " U+%04X", unsigned(c));
  return shown + code;
}

void check_vocabulary(const std::vector<std::u32string>& texts, const std::u32string& vocab,
                      const std::string& what,
                      const std::function<std::string(size_t, size_t)>& where) {
  struct Unknown {
    int64_t count = 0;
    size_t text = 0, pos = 0;  // its first occurrence
  };
  std::map<char32_t, Unknown> unknown;
  const std::unordered_set<char32_t> known(vocab.begin(), vocab.end());
  for (size_t t = 0; t < texts.size(); ++t)
    for (size_t i = 0; i < texts[t].size(); ++i)
      if (!known.count(texts[t][i])) {
        Unknown& u = unknown[texts[t][i]];
        if (u.count++ == 0) u.text = t, u.pos = i;
      }
  if (unknown.empty()) return;
  std::string list;
  size_t shown = 0;
  for (const auto& [c, u] : unknown) {
    if (shown++ == 8) {
      list += ", ...";
      break;
    }
    list += (list.empty() ? "" : ", ") + shown_character(c) + " (" + std::to_string(u.count) +
            (u.count == 1 ? " time, " : " times, first ") + where(u.text, u.pos) + ")";
  }
  fail(what, ": ", unknown.size(), unknown.size() == 1 ? " character is" : " characters are",
       " not in the vocabulary of the model (", vocab.size(),
       " characters, from the text it was trained on): ", list, "; remove or replace them");
}

namespace {

// Chunk starts of seq_len + 1 ids for each split of d.ids; with `every_sequence`, all of them in
// the test split.
void chunk_splits(const DataOptions& opt, TextData& d, const char* unit, bool every_sequence) {
  const int64_t n = static_cast<int64_t>(d.ids.size());
  auto chunks = [&](int64_t begin, int64_t end, std::vector<int64_t>* out) {
    for (int64_t s = begin; s + d.seq_len + 1 <= end; s += d.seq_len) out->push_back(s);
  };
  if (every_sequence) {
    chunks(0, n, &d.split.test);
    if (d.split.test.empty())
      fail(opt.path, ": ", n, " ", unit, ", fewer than data.seq_len + 1 (", d.seq_len + 1,
           "): no sequence to evaluate");
    // Each sequence scores its seq_len next ids; the first id is no prediction's target.
    const int64_t unscored = n - 1 - static_cast<int64_t>(d.split.test.size()) * d.seq_len;
    if (unscored > 0)
      d.notes.push_back(opt.path + ": its last " + std::to_string(unscored) + " " + unit +
                        " are not scored (fewer than data.seq_len " + std::to_string(d.seq_len) +
                        " after the last whole sequence)");
    return;
  }
  const auto [train_end, val_end] = boundaries(opt.split, n);
  if (opt.split.mode == "random") {
    std::vector<int64_t> all;
    chunks(0, n, &all);
    random_split(opt.split, all, &d.split);
  } else {
    chunks(0, train_end, &d.split.train);
    chunks(train_end, val_end, &d.split.val);
    chunks(val_end, n, &d.split.test);
  }
  if (d.split.train.empty())
    fail(opt.path, ": the training split (", train_end, " ", unit,
         ") is shorter than data.seq_len + 1");
}

}  // namespace

namespace {

// The documents of a CSV column (one per row, empty cells left out with a note), each one's
// tokens followed by the end-of-text token, packed into one stream as the blocks cut it.
void document_tokens(const DataOptions& opt, const text::Tokenizer& tokenizer, TextData* d) {
  const TextOptions& o = opt.text;
  int32_t eos = -1;
  if (!o.eos_token.empty()) {
    const std::optional<int32_t> id = tokenizer.token_to_id(o.eos_token);
    if (!id) fail(o.eos_from, ": '", o.eos_token, "' is not a token of ", o.tokenizer);
    eos = *id;
  } else {
    if (o.eos_id < 0 || o.eos_id >= tokenizer.vocab_size())
      fail(o.eos_from, ": ", o.eos_id, " is not an id of ", o.tokenizer, " (",
           tokenizer.vocab_size(), " tokens)");
    eos = static_cast<int32_t>(o.eos_id);
  }
  const io::CsvTable table = io::CsvTable::read(opt.path);
  const std::string& column = o.columns[0];
  if (!table.has_column(column))
    fail(opt.where("data.text_columns"), ": data.text_columns: ", opt.path, " has no column '",
         column, "'", table.columns_hint());
  int64_t empty = 0, dropped = 0;
  std::string first_dropped;
  for (int64_t r = 0; r < table.rows(); ++r) {
    const std::string_view cell = table.text(column)[r];
    if (cell.empty()) {
      ++empty;
      continue;
    }
    try {
      const text::Encoding e = tokenizer.encode(cell, false);
      d->ids.insert(d->ids.end(), e.ids.begin(), e.ids.end());
      if (e.dropped > 0 && dropped == 0)
        first_dropped = opt.path + ":" + std::to_string(table.line_of_row(r));
      dropped += e.dropped;
    } catch (const Error& e) {
      fail(opt.path, ":", table.line_of_row(r), ": column '", column, "': ", e.what());
    }
    d->ids.push_back(eos);
  }
  if (const std::string note =
          dropped_characters_note(dropped, o.tokenizer, "column '" + column + "'", first_dropped);
      !note.empty())
    d->notes.push_back(note);
  if (d->ids.empty()) fail(opt.path, ": column '", column, "' holds no text");
  if (empty)
    d->notes.push_back(std::to_string(empty) + " of " + std::to_string(table.rows()) +
                       " rows with no text in column '" + column + "' left out");
}

}  // namespace

text::Tokenizer read_tokenizer(const std::string& path, uint64_t expected, uint64_t* hash) {
  const std::string bytes = io::read_file(path);
  *hash = hash_text(bytes);
  if (expected != 0 && *hash != expected)
    fail(path, ": this tokenizer is not the file the model was trained with (it changed since): ",
         "its ids would mean other tokens; give the run the tokenizer.json it used (a decoder ",
         "run keeps a copy in its directory)");
  return text::Tokenizer::from_json(bytes, path);
}

std::string dropped_characters_note(int64_t dropped, const std::string& path,
                                    const std::string& what, const std::string& first) {
  if (dropped == 0) return "";
  const bool one = dropped == 1;
  return std::to_string(dropped) + (one ? " character of " : " characters of ") + what +
         (one ? " has" : " have") + " no token in " + path +
         " and it has no unknown token to stand for " + (one ? "it: it is" : "them: they are") +
         " left out, as Hugging Face's tokenizers leave them out" +
         (first.empty() ? "" : " (the first at " + first + ")");
}

namespace {
// A text file's line ends as Python's text mode reads them (a PyTorch user's open(path).read()):
// "\r\n" and a lone "\r" become "\n"; a note counts them.
std::string with_python_newlines(std::string bytes, const std::string& path,
                                 std::vector<std::string>* notes) {
  if (bytes.find('\r') == std::string::npos) return bytes;
  std::string out;
  out.reserve(bytes.size());
  int64_t ends = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != '\r') {
      out += bytes[i];
      continue;
    }
    out += '\n';
    ++ends;
    if (i + 1 < bytes.size() && bytes[i + 1] == '\n') ++i;
  }
  notes->push_back(path + ": " + std::to_string(ends) +
                   " Windows (\\r\\n) or old Mac (\\r) line ends read as \\n, as Python's text "
                   "mode reads them");
  return out;
}
}  // namespace

TextData load_tokens(const DataOptions& opt, const TextData* stored, bool every_sequence) {
  TextData d;
  d.seq_len = opt.text.seq_len;
  d.tokenizer = opt.text.tokenizer;
  const text::Tokenizer tokenizer =
      read_tokenizer(d.tokenizer, stored ? stored->tokenizer_hash : 0, &d.tokenizer_hash);
  d.token_vocab = tokenizer.vocab_size();
  if (!opt.text.columns.empty()) {
    document_tokens(opt, tokenizer, &d);
  } else {
    const std::string bytes =
        with_python_newlines(io::read_text_file(opt.path), opt.path, &d.notes);
    if (bytes.empty()) fail(opt.path, ": empty file");
    try {
      // The file is one document: its tokens without a template's special tokens.
      const text::Encoding e = tokenizer.encode(bytes, false);
      d.ids.assign(e.ids.begin(), e.ids.end());
      if (const std::string note = dropped_characters_note(e.dropped, d.tokenizer, opt.path, "");
          !note.empty())
        d.notes.push_back(note);
    } catch (const Error& e) {
      fail(opt.path, ": ", e.what());
    }
  }
  chunk_splits(opt, d, "tokens", every_sequence);
  return d;
}

TextData load_text(const DataOptions& opt, const std::u32string& vocab, bool every_sequence) {
  TextData d;
  d.seq_len = opt.text.seq_len;
  const std::string& path = opt.path;
  // A byte-order mark is no character.
  const std::string bytes = with_python_newlines(io::read_text_file(path), path, &d.notes);
  const std::u32string text = decode_utf8(bytes, path);
  if (text.empty()) fail(path, ": empty file");
  d.vocab = vocab;
  if (d.vocab.empty()) {
    // Control characters (a NUL, an escape) in prose are a damaged or binary part more often than
    // text: they are characters like any other, and said.
    const auto control = [](char32_t c) {
      return (c < 0x20 && c != U'\n' && c != U'\t' && c != U'\f') || c == 0x7f;
    };
    if (const auto first = std::find_if(text.begin(), text.end(), control); first != text.end()) {
      char code[16];
      std::snprintf(code, sizeof code, "U+%04X", unsigned(*first));
      d.notes.push_back(path + ": " + std::to_string(std::count_if(first, text.end(), control)) +
                        " control characters (the first " + code + " at line " +
                        std::to_string(1 + std::count(text.begin(), first, U'\n')) +
                        ") are characters the model learns: a damaged or binary part?");
    }
    d.vocab = text;
    std::sort(d.vocab.begin(), d.vocab.end());
    d.vocab.erase(std::unique(d.vocab.begin(), d.vocab.end()), d.vocab.end());
  } else {
    check_vocabulary({text}, d.vocab, path, [&](size_t, size_t i) {
      return "at line " + std::to_string(1 + std::count(text.begin(), text.begin() + i, U'\n'));
    });
  }
  std::unordered_map<char32_t, int64_t> index;
  for (size_t i = 0; i < d.vocab.size(); ++i) index.emplace(d.vocab[i], int64_t(i));
  d.ids.resize(text.size());
  for (size_t i = 0; i < text.size(); ++i) d.ids[i] = index.at(text[i]);
  chunk_splits(opt, d, "characters", every_sequence);
  return d;
}

}  // namespace seqforge
