// text_classify's examples: a text, or a pair of texts, and a class per CSV row, as character
// ids over the vocabulary (the file's, or a pre-trained model's), or as a tokenizer's tokens.
#include <algorithm>
#include <map>
#include <string_view>
#include <unordered_map>

#include "data/splits.hpp"
#include "io/file_util.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/data/datasets.hpp"
#include "seqforge/io/csv.hpp"
#include "seqforge/text/tokenizer.hpp"

namespace seqforge {

namespace {

// Cuts a and b (longest_first) so that a + sep + b fits in `limit`; returns whether anything was
// cut.
bool truncate_pair(std::u32string* a, std::u32string* b, size_t sep, size_t limit) {
  const auto [keep_a, keep_b] = text::truncate_longest_first(a->size(), b->size(), limit - sep);
  const bool cut = keep_a < a->size() || keep_b < b->size();
  a->resize(keep_a);
  b->resize(keep_b);
  return cut;
}

// Each row as token ids of opt.text.tokenizer: text A (and text B) encoded, cut longest first
// (HF's longest_first) so that they and the template's special tokens fit in seq_len, then the
// template applied (a pair's); A's share is the tokens of type 0.
void token_examples(const DataOptions& opt, const io::CsvTable& table, const TextData* stored,
                    TextData* d) {
  const TextOptions& o = opt.text;
  const text::Tokenizer tokenizer =
      read_tokenizer(o.tokenizer, stored ? stored->tokenizer_hash : 0, &d->tokenizer_hash);
  d->tokenizer = o.tokenizer;
  d->token_vocab = tokenizer.vocab_size();
  const bool pair = d->segments == 2;
  text::Encoding empty;
  const int64_t specials =
      int64_t(tokenizer.with_template(empty, pair ? &empty : nullptr).ids.size());
  if (specials >= d->seq_len)
    fail(opt.where("data.seq_len"), ": data.seq_len ", d->seq_len,
         " leaves no room for text beside the ", specials,
         " special tokens of the tokenizer's template");
  const int64_t n = table.rows();
  int64_t dropped = 0;
  std::string first_dropped;
  d->offsets.push_back(0);
  for (int64_t r = 0; r < n; ++r) {
    d->lines.push_back(table.line_of_row(r));
    text::Encoding parts[2];
    for (size_t k = 0; k < o.columns.size(); ++k) {
      const std::string_view cell = table.text(o.columns[k])[r];
      if (cell.empty())
        fail(opt.path, ":", table.line_of_row(r), ": column '", o.columns[k], "' is empty");
      try {
        parts[k] = tokenizer.encode(cell, false);
        if (parts[k].dropped > 0 && dropped == 0)
          first_dropped = opt.path + ":" + std::to_string(table.line_of_row(r));
        dropped += parts[k].dropped;
      } catch (const Error& e) {
        fail(opt.path, ":", table.line_of_row(r), ": column '", o.columns[k], "': ", e.what());
      }
    }
    const auto [keep_a, keep_b] = text::truncate_longest_first(
        parts[0].ids.size(), parts[1].ids.size(), size_t(d->seq_len - specials));
    bool cut = false;
    for (auto [part, keep] : {std::pair{&parts[0], keep_a}, std::pair{&parts[1], keep_b}}) {
      cut = cut || keep < part->ids.size();
      part->ids.resize(keep);
      part->type_ids.resize(keep);
      part->special.resize(keep);
    }
    d->truncated += cut;
    const text::Encoding e = tokenizer.with_template(parts[0], pair ? &parts[1] : nullptr);
    d->ids.insert(d->ids.end(), e.ids.begin(), e.ids.end());
    d->offsets.push_back(int64_t(d->ids.size()));
    d->first_lengths.push_back(int64_t(std::count(e.type_ids.begin(), e.type_ids.end(), 0)));
  }
  std::string columns;
  for (const std::string& c : o.columns) columns += (columns.empty() ? "" : " and ") + c;
  if (const std::string note = dropped_characters_note(
          dropped, o.tokenizer, "data.text_columns' " + columns, first_dropped);
      !note.empty())
    d->notes.push_back(note);
}

}  // namespace

TextData load_text_examples(const DataOptions& opt, const TextData* stored, WindowSet which) {
  // Training needs every class; eval --data and predict leave out the rows they cannot score.
  const bool lenient = which != WindowSet::splits;
  const TextOptions& o = opt.text;
  if (o.columns.empty() || o.columns.size() > 2)
    fail(opt.where("data.text_columns"),
         ": data.text_columns must name one text column or two (a pair), got ", o.columns.size());
  if (o.class_col.empty())
    fail(opt.where("data.class_column"), ": data.class_column is required for text_classify");
  const io::CsvTable table = io::CsvTable::read(opt.path);
  for (const std::string& c : o.columns)
    if (!table.has_column(c))
      fail(opt.where("data.text_columns"), ": data.text_columns: ", opt.path, " has no column '", c,
           "'", table.columns_hint());
  TextData d;
  if (table.delimiter() != ',')
    d.notes.push_back(opt.path + ": fields separated by " + table.delimiter_name() +
                      " (as the header's are)");
  d.seq_len = o.seq_len;
  d.segments = o.columns.size() == 2 ? 2 : 0;
  d.has_classes = table.has_column(o.class_col);
  if (!d.has_classes && which != WindowSet::every_window)
    fail(opt.where("data.class_column"), ": data.class_column: ", opt.path, " has no column '",
         o.class_col, "'", table.columns_hint());
  const int64_t n = table.rows();
  if (n == 0) fail(opt.path, ": no rows");
  if (!o.tokenizer.empty()) {
    token_examples(opt, table, stored, &d);
  } else {
    const std::u32string sep =
        decode_utf8(o.separator, opt.where("data.separator") + ": data.separator");
    if (d.segments == 2 && static_cast<int64_t>(sep.size()) + 2 > d.seq_len)
      fail(opt.where("data.seq_len"), ": data.seq_len ", d.seq_len,
           " leaves no room for two texts and the ", sep.size(), "-character data.separator");
    // Each row's characters: text A (+ separator + text B), and A's share. A new vocabulary
    // holds the file's characters, also those only the cut parts hold (another file may not cut
    // them).
    const bool new_vocabulary = !stored || stored->vocab.empty();
    std::u32string characters;
    std::vector<std::u32string> texts(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) {
      auto cell = [&](size_t k) {
        return decode_utf8(table.text(o.columns[k])[r], opt.path + ":" +
                                                            std::to_string(table.line_of_row(r)) +
                                                            ": column '" + o.columns[k] + "'");
      };
      std::u32string a = cell(0), b;
      for (size_t k = 0; k < o.columns.size(); ++k)
        if (table.text(o.columns[k])[r].empty())
          fail(opt.path, ":", table.line_of_row(r), ": column '", o.columns[k], "' is empty");
      if (d.segments == 2) b = cell(1);
      if (new_vocabulary) characters += d.segments == 2 ? a + sep + b : a;
      if (d.segments == 2) {
        d.truncated += truncate_pair(&a, &b, sep.size(), static_cast<size_t>(d.seq_len));
        a += sep;
      } else if (static_cast<int64_t>(a.size()) > d.seq_len) {
        a.resize(static_cast<size_t>(d.seq_len));
        ++d.truncated;
      }
      d.first_lengths.push_back(static_cast<int64_t>(a.size()));
      texts[r] = a + b;
      d.lines.push_back(table.line_of_row(r));
    }
    if (!new_vocabulary) {
      d.vocab = stored->vocab;
      // The separator's characters are the config's, not the file's.
      if (d.segments == 2)
        check_vocabulary(
            {sep}, d.vocab, opt.where("data.separator") + ": data.separator",
            [](size_t, size_t i) { return "at its character " + std::to_string(i + 1); });
      check_vocabulary(texts, d.vocab, opt.path,
                       [&](size_t r, size_t) { return "at line " + std::to_string(d.lines[r]); });
    } else {
      d.vocab = std::move(characters);
      std::sort(d.vocab.begin(), d.vocab.end());
      d.vocab.erase(std::unique(d.vocab.begin(), d.vocab.end()), d.vocab.end());
    }
    std::unordered_map<char32_t, int64_t> index;
    for (size_t i = 0; i < d.vocab.size(); ++i) index.emplace(d.vocab[i], int64_t(i));
    d.offsets.push_back(0);
    for (int64_t r = 0; r < n; ++r) {
      for (const char32_t c : texts[r]) d.ids.push_back(index.at(c));
      d.offsets.push_back(static_cast<int64_t>(d.ids.size()));
    }
  }
  d.classes.assign(static_cast<size_t>(n), -1);
  if (stored && !stored->class_names.empty()) d.class_names = stored->class_names;
  if (d.has_classes) {
    const auto& names = table.text(o.class_col);
    for (int64_t r = 0; r < n; ++r) {  // not a class named "", nor one JSON cannot store
      const std::string where =
          opt.path + ":" + std::to_string(d.lines[r]) + ": column '" + o.class_col + "'";
      if (names[r].empty() && !lenient) fail(where, " is empty (every example needs a class)");
      decode_utf8(names[r], where);
    }
    if (d.class_names.empty()) {
      for (const std::string_view name : names) d.class_names.emplace_back(name);
      d.class_names = io::ordered_class_names(std::move(d.class_names));
      if (const std::string alike = io::names_alike(d.class_names); !alike.empty())
        d.notes.push_back("classes " + alike + " in column '" + o.class_col +
                          "' differ only in case, spaces or how a number is written: each trains "
                          "as a class of its own");
    }
    std::map<std::string, int64_t> unseen;  // class name -> rows
    int64_t empty = 0;
    std::unordered_map<std::string_view, int64_t> index;  // class name -> number
    for (size_t k = 0; k < d.class_names.size(); ++k) index.emplace(d.class_names[k], int64_t(k));
    for (int64_t r = 0; r < n; ++r) {
      if (const auto it = index.find(names[r]); it != index.end())
        d.classes[r] = it->second;
      else if (!lenient)
        fail(opt.path, ":", d.lines[r], ": class '", names[r], "' was not seen in training");
      else
        ++(names[r].empty() ? empty : unseen[std::string(names[r])]);
    }
    auto rows = [](int64_t k) { return std::to_string(k) + (k == 1 ? " row has" : " rows have"); };
    for (const auto& [name, k] : unseen)
      d.notes.push_back(rows(k) + " class '" + name + "' in column '" + o.class_col +
                        "', which the model was not trained on" +
                        io::known_otherwise(name, d.class_names) + ": no actual class for " +
                        (k == 1 ? "it" : "them"));
    if (empty) d.notes.push_back(rows(empty) + " no class in column '" + o.class_col + "'");
  }
  if (d.class_names.size() < 2 && !lenient)
    fail(opt.path, ": data.class_column '", o.class_col, "' holds ", d.class_names.size(),
         " class; classification needs at least 2");
  std::vector<int64_t> all(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) all[i] = i;
  if (opt.split.mode == "random") {
    random_split(opt.split, all, &d.split);
  } else {
    const auto [a, b] = boundaries(opt.split, n);
    d.split.train.assign(all.begin(), all.begin() + a);
    d.split.val.assign(all.begin() + a, all.begin() + b);
    d.split.test.assign(all.begin() + b, all.end());
  }
  if (!lenient) {
    std::vector<int64_t> train_classes;
    for (int64_t e : d.split.train) train_classes.push_back(d.classes[e]);
    if (std::string note = untrained_classes_note(d.class_names, train_classes, "example");
        !note.empty())
      d.notes.push_back(std::move(note));
  }
  return d;
}

}  // namespace seqforge
