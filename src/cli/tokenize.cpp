// `seqforge tokenize TOKENIZER.json` (a line of text in, a line of ids out; with -z a text ends
// with a NUL byte and may hold newlines) and
// `seqforge tokenizer train TEXT -o tokenizer.json`.
#include <charconv>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "io/file_util.hpp"
#include "observe.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/text/tokenizer.hpp"
#include "seqforge/train/trainer.hpp"
#include "validators.hpp"

namespace seqforge::cli {

namespace {

struct TokenizeOptions {
  std::string tokenizer;
  bool pair = false, whole = false, no_special = false, decode = false, skip_special = false,
       null_data = false;
};
TokenizeOptions tokenize_options;

struct TrainOptions {
  std::string text, output;
  text::BpeTrainOptions bpe;
};
TrainOptions train_options;

std::vector<int32_t> parse_ids(const std::string& line) {
  std::vector<int32_t> ids;
  const char* p = line.data();
  const char* end = p + line.size();
  while (p < end) {
    if (*p == ' ' || *p == '\t' || *p == '\r') {
      ++p;
      continue;
    }
    int32_t id = 0;
    const auto [next, ec] = std::from_chars(p, end, id);
    if (ec != std::errc() || (next < end && *next != ' ' && *next != '\t' && *next != '\r'))
      fail("'", line, "' is not a list of token ids");  // the caller names the line
    ids.push_back(id);
    p = next;
  }
  return ids;
}

}  // namespace

CLI::App* add_tokenize(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "tokenize",
      "Encode standard input with a Hugging Face tokenizer.json: each line's ids on a line");
  TokenizeOptions& o = tokenize_options;
  cmd->add_option("tokenizer", o.tokenizer, "tokenizer.json")->required();
  cmd->add_flag("--pair", o.pair,
                "each line holds a pair of texts separated by a tab (the pair template applies)");
  cmd->add_flag("--whole", o.whole, "all of standard input is one text (newlines included)");
  cmd->add_flag("--no-special", o.no_special,
                "leave out the special tokens the post-processor adds (BOS, EOS, ...)");
  cmd->add_flag("--decode", o.decode, "the other way: each line's ids back to text");
  cmd->add_flag("--skip-special", o.skip_special, "with --decode: leave special tokens out");
  cmd->add_flag("-z,--null-data", o.null_data,
                "texts end with a NUL byte instead of a newline, so they may hold newlines "
                "(with --decode: each text written so)");
  return cmd;
}

int run_tokenize() {
  const TokenizeOptions& o = tokenize_options;
  const text::Tokenizer tokenizer = text::Tokenizer::from_file(o.tokenizer);
  std::string line, out;
  const auto print_ids = [&](const std::vector<int32_t>& ids) {
    out.clear();
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) out += ' ';
      out += std::to_string(ids[i]);
    }
    out += '\n';
    std::fwrite(out.data(), 1, out.size(), stdout);
  };
  if (o.skip_special && !o.decode)
    fail(
        "tokenize: --skip-special leaves special tokens out of decoded text; it needs --decode "
        "(encoding without them: --no-special)");
  if (o.whole) {
    if (o.pair || o.decode || o.null_data)
      fail("tokenize: --whole encodes one text; leave out --pair, --decode and -z");
    std::string all((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    try {
      print_ids(tokenizer.encode(all, !o.no_special).ids);
    } catch (const Error& e) {
      fail("tokenize: standard input: ", e.what());
    }
    return 0;
  }
  // The text side's separator: lines of ids always end with a newline.
  const char text_end = o.null_data ? '\0' : '\n';
  const char* const unit = o.null_data && !o.decode ? "text" : "line";
  int64_t number = 0;
  while (std::getline(std::cin, line, o.decode ? '\n' : text_end)) {
    ++number;
    try {
      if (o.decode) {
        out = tokenizer.decode(parse_ids(line), o.skip_special) + text_end;
        std::fwrite(out.data(), 1, out.size(), stdout);
      } else if (o.pair) {
        const size_t tab = line.find('\t');
        if (tab == std::string::npos) fail("no tab between the two texts of the pair (--pair)");
        const std::string_view both(line);
        print_ids(
            tokenizer.encode_pair(both.substr(0, tab), both.substr(tab + 1), !o.no_special).ids);
      } else {
        print_ids(tokenizer.encode(line, !o.no_special).ids);
      }
    } catch (const Error& e) {
      fail("tokenize: standard input ", unit, " ", number, ": ", e.what());
    }
  }
  return 0;
}

CLI::App* add_tokenizer(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("tokenizer", "Make tokenizers");
  cmd->require_subcommand(1);
  CLI::App* train = cmd->add_subcommand(
      "train", "Fit a byte-level BPE on a text file and write it as a tokenizer.json");
  TrainOptions& o = train_options;
  train->add_option("text", o.text, "UTF-8 text file")->required();
  train->add_option("-o,--output", o.output, "tokenizer.json to write")
      ->required()
      ->check(a_path());
  train
      ->add_option("--vocab-size", o.bpe.vocab_size,
                   "tokens in all: 256 bytes, the merges and the special tokens")
      ->check(whole_number(1, INT32_MAX))
      ->capture_default_str();
  train
      ->add_option("--min-frequency", o.bpe.min_frequency,
                   "stop before merging a pair seen fewer times")
      ->check(whole_number(0, INT64_MAX))
      ->capture_default_str();
  train->add_option("--special", o.bpe.special_tokens, "special tokens, given ids 0, 1, ...")
      ->capture_default_str();
  return cmd;
}

int run_tokenizer() {
  const TrainOptions& o = train_options;
  check_output_file(o.output, "tokenizer train: -o", {{o.text, "the text it trains on"}});
  const std::string text = io::read_file(o.text);
  std::string json;
  try {
    json = text::train_byte_level_bpe(text, o.bpe);
  } catch (const Error& e) {
    fail(o.text, ": ", e.what());
  }
  io::write_file_atomically(o.output, {{json.data(), json.size()}});
  const text::Tokenizer check = text::Tokenizer::from_json(json, o.output);
  std::printf("wrote %s: %d tokens\n", o.output.c_str(), check.vocab_size());
  return 0;
}

}  // namespace seqforge::cli
