// data.task lm on a CSV column: each row a document, its tokens followed by the end-of-text token
// (data.eos_token, tokenizer_config.json's eos_token, or the model folder's eos_token_id), empty
// rows left out with a note, and each way of naming the token that is wrong one error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "seqforge/text/tokenizer.hpp"
#include "seqforge/train/config.hpp"
#include "seqforge/train/data_options.hpp"
#include "seqforge/train/trainer.hpp"
#include "test_util.hpp"

namespace seqforge::lm_documents_test {
namespace {

namespace fs = std::filesystem;

struct Folder {
  fs::path dir, csv, tokenizer;
};

// A tokenizer fitted on the documents (<|endoftext|> its id 0) and a CSV of them with an empty
// row, in a fresh directory.
Folder make_folder(const std::string& name, const std::vector<std::string>& docs) {
  Folder f;
  f.dir = fs::temp_directory_path() / ("seqforge_lm_docs_" + name + std::to_string(getpid()));
  fs::remove_all(f.dir);
  fs::create_directories(f.dir);
  std::string all;
  for (const std::string& d : docs) all += d + "\n";
  f.tokenizer = f.dir / "tokenizer.json";
  std::ofstream(f.tokenizer) << text::train_byte_level_bpe(all, {.vocab_size = 300});
  f.csv = f.dir / "docs.csv";
  std::ofstream csv(f.csv);
  csv << "id,text\n";
  for (size_t i = 0; i < docs.size(); ++i) csv << i << ",\"" << docs[i] << "\"\n";
  csv << docs.size() << ",\n";  // no text: left out
  return f;
}

Config lm_config(const Folder& f, std::vector<std::string> extra) {
  extra.push_back("data.path=" + f.csv.string());
  extra.push_back("data.tokenizer=" + f.tokenizer.string());
  return Config::parse("data: {task: lm, seq_len: 4, text_columns: [text]}\n", "lm.yaml", extra);
}

TEST(LmDocuments, EachRowEndsWithTheEndOfTextToken) {
  const std::vector<std::string> docs = {"To be, or not to be", "that is the question",
                                         "Whether 'tis nobler in the mind to suffer"};
  const Folder f = make_folder("rows", docs);
  const text::Tokenizer tok = text::Tokenizer::from_file(f.tokenizer.string());
  std::vector<int64_t> want;
  for (const std::string& d : docs) {
    for (int32_t id : tok.encode(d, false).ids) want.push_back(id);
    want.push_back(0);  // <|endoftext|>
  }
  const Dataset d = load_dataset(lm_config(f, {"data.eos_token=<|endoftext|>"}));
  EXPECT_EQ(d.text.ids, want);
  ASSERT_EQ(d.text.notes.size(), 1u);
  EXPECT_NE(d.text.notes[0].find("1 of 4 rows with no text in column 'text' left out"),
            std::string::npos)
      << d.text.notes[0];

  // The token from tokenizer_config.json beside the tokenizer (HF writes it as a string or as
  // an object), else an id from the model folder's config.json.
  std::ofstream(f.dir / "tokenizer_config.json")
      << R"({"eos_token": {"content": "<|endoftext|>", "special": true}})";
  EXPECT_EQ(load_dataset(lm_config(f, {})).text.ids, want);
  fs::remove(f.dir / "tokenizer_config.json");
  const fs::path model = f.dir / "model";
  fs::create_directories(model);
  std::ofstream(model / "config.json") << R"({"eos_token_id": [0, 7]})";
  EXPECT_EQ(load_dataset(lm_config(f, {"model.init_from=" + model.string()})).text.ids, want);
  fs::remove_all(f.dir);
}

// A text file with Windows line ends reads as Python's text mode reads it: "\r\n" is "\n", and
// no "\r" enters the characters a model learns.
TEST(LmDocuments, WindowsLineEndsReadAsPythonReadsThem) {
  const fs::path dir = fs::temp_directory_path() / ("seqforge_crlf_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::string unix_text, windows_text;
  for (int i = 0; i < 40; ++i) {
    unix_text += "line " + std::to_string(i) + "\n";
    windows_text += "line " + std::to_string(i) + (i == 7 ? "\r" : "\r\n");
  }
  std::ofstream(dir / "unix.txt", std::ios::binary) << unix_text;
  std::ofstream(dir / "windows.txt", std::ios::binary) << windows_text;
  const auto load = [&](const std::string& name) {
    return load_dataset(Config::parse("data: {task: charlm, seq_len: 8}\n", "c.yaml",
                                      {"data.path=" + (dir / name).string()}));
  };
  const Dataset u = load("unix.txt"), w = load("windows.txt");
  EXPECT_EQ(w.text.vocab, u.text.vocab);
  EXPECT_EQ(w.text.ids, u.text.ids);
  ASSERT_EQ(w.text.notes.size(), 1u);
  EXPECT_NE(w.text.notes[0].find("windows.txt: 40 Windows (\\r\\n) or old Mac (\\r) line ends "
                                 "read as \\n"),
            std::string::npos)
      << w.text.notes[0];
  fs::remove_all(dir);
}

// A NUL or another control character in a character model's text is a character (as Python reads
// it), with a note naming it and its line; tabs and line ends get none.
TEST(LmDocuments, ControlCharactersInTextGetANote) {
  const fs::path dir = fs::temp_directory_path() / ("seqforge_nul_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::string clean, damaged;
  for (int i = 0; i < 40; ++i) {
    clean += "line\t" + std::to_string(i) + "\n";
    damaged += "line\t" + std::to_string(i) + (i == 6 ? std::string(1, '\0') + "\x1b" : "") + "\n";
  }
  std::ofstream(dir / "clean.txt", std::ios::binary) << clean;
  std::ofstream(dir / "damaged.txt", std::ios::binary) << damaged;
  const auto load = [&](const std::string& name) {
    return load_dataset(Config::parse("data: {task: charlm, seq_len: 8}\n", "c.yaml",
                                      {"data.path=" + (dir / name).string()}));
  };
  const Dataset c = load("clean.txt"), d = load("damaged.txt");
  EXPECT_TRUE(c.text.notes.empty());
  EXPECT_EQ(d.text.vocab.size(), c.text.vocab.size() + 2);
  EXPECT_EQ(d.text.vocab[0], U'\0');
  ASSERT_EQ(d.text.notes.size(), 1u);
  EXPECT_NE(d.text.notes[0].find("damaged.txt: 2 control characters (the first U+0000 at line 7)"),
            std::string::npos)
      << d.text.notes[0];
  fs::remove_all(dir);
}

// A tokenizer with no token for a character and no unknown token leaves it out, as Hugging
// Face's does; the loader says how many and where the first was.
TEST(LmDocuments, CharactersATokenizerLeavesOutAreCounted) {
  const fs::path dir = fs::temp_directory_path() / ("seqforge_dropped_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string tokenizer = (dir / "tokenizer.json").string();
  std::ofstream(tokenizer)
      << R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "<eos>": 2}, "merges": []}})";
  std::ofstream(dir / "docs.csv") << "text\nabab\nabcab\nbac\n";
  std::ofstream(dir / "all.txt") << "abab\nabcab\nbac\n";
  const Dataset docs = load_dataset(Config::parse(
      "data: {task: lm, seq_len: 2, text_columns: [text], eos_token: <eos>}\n", "c.yaml",
      {"data.path=" + (dir / "docs.csv").string(), "data.tokenizer=" + tokenizer}));
  ASSERT_EQ(docs.text.notes.size(), 1u);
  EXPECT_EQ(docs.text.notes[0], "2 characters of column 'text' have no token in " + tokenizer +
                                    " and it has no unknown token to stand for them: they are "
                                    "left out, as Hugging Face's tokenizers leave them out (the "
                                    "first at " +
                                    (dir / "docs.csv").string() + ":3)");
  const Dataset all = load_dataset(
      Config::parse("data: {task: lm, seq_len: 2}\n", "c.yaml",
                    {"data.path=" + (dir / "all.txt").string(), "data.tokenizer=" + tokenizer}));
  ASSERT_EQ(all.text.notes.size(), 1u);
  EXPECT_NE(
      all.text.notes[0].find("5 characters of " + (dir / "all.txt").string() + " have no token"),
      std::string::npos)
      << all.text.notes[0];  // two c's and three line ends
  fs::remove_all(dir);
}

TEST(LmDocuments, AMissingOrUnknownEndOfTextTokenIsOneError) {
  const Folder f = make_folder("errors", {"one document", "another one"});
  const auto error = [&](std::vector<std::string> extra) {
    return test::error_of([&] { load_dataset(lm_config(f, std::move(extra))); });
  };
  EXPECT_NE(error({}).find("data.eos_token: data.task lm on data.text_columns ends each document"),
            std::string::npos)
      << error({});
  EXPECT_NE(error({"data.eos_token=</s>"}).find("'</s>' is not a token of"), std::string::npos)
      << error({"data.eos_token=</s>"});
  EXPECT_NE(error({"data.eos_token=x", "data.text_columns=[body]"}).find("has no column 'body'"),
            std::string::npos);
  EXPECT_NE(error({"data.text_columns=[text, id]"}).find("reads one text column"),
            std::string::npos);
  const fs::path model = f.dir / "model";
  fs::create_directories(model);
  std::ofstream(model / "config.json") << R"({"eos_token_id": 5000})";
  const std::string past = error({"model.init_from=" + model.string()});
  EXPECT_NE(past.find("eos_token_id: 5000 is not an id of"), std::string::npos) << past;
  fs::remove_all(f.dir);
}

// generate streams a token model's sample as it is made: the pieces join into the text it
// returns, each piece whole UTF-8 characters though byte-level tokens split them.
TEST(LmDocuments, GenerateStreamsWholeCharactersThatJoinIntoTheSample) {
  std::vector<std::string> docs;
  for (int i = 0; i < 20; ++i)
    for (const char* d :
         {"caf\u00e9 cr\u00e8me br\u00fbl\u00e9e", "\u65e5\u672c\u8a9e\u306e\u6587\u7ae0",
          "na\u00efve fa\u00e7ade \U0001F600 d\u00e9j\u00e0 vu"})
      docs.push_back(d);
  const Folder f = make_folder("stream", docs);
  const fs::path model = f.dir / "model", run = f.dir / "run";
  fs::create_directories(model);
  std::ofstream(model / "config.json") << R"({"model_type": "llama", "vocab_size": 300,
      "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
      "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
      "max_position_embeddings": 64, "tie_word_embeddings": true, "eos_token_id": 0})";
  std::ostringstream log;
  train(lm_config(f, {"data.eos_token=<|endoftext|>", "model.family=decoder",
                      "model.init_from=" + model.string(), "model.from_config=true",
                      "train.epochs=20", "optim.lr=0.01", "train.run_dir=" + run.string()}),
        log);
  // A sample may end at an early end-of-text token (how early depends on the trained weights'
  // last bits), so each must come in more than one piece and the longest in many.
  size_t most_pieces = 0;
  for (uint64_t seed : {1, 2, 3}) {
    std::vector<std::string> pieces;
    const std::string sample =
        generate(run.string(), "caf", 40, 0.7, 0, seed, 1.0,
                 [&](std::string_view piece) { pieces.emplace_back(piece); });
    std::string joined;
    for (const std::string& piece : pieces) joined += piece;
    EXPECT_EQ(joined, sample);
    ASSERT_FALSE(pieces.empty());
    EXPECT_EQ(pieces.front(), "caf");
    if (sample.size() > 4) {
      EXPECT_GT(pieces.size(), 1u) << "streamed as it is made: " << sample;
    }
    most_pieces = std::max(most_pieces, pieces.size());
    for (size_t i = 0; i + 1 < pieces.size(); ++i) {  // the last one flushes what is left
      EXPECT_FALSE(pieces[i].ends_with("\xef\xbf\xbd")) << pieces[i];
      const unsigned char end = static_cast<unsigned char>(pieces[i].back());
      EXPECT_TRUE(end < 0x80 || (end & 0xc0) == 0x80) << "a character cut short: " << pieces[i];
    }
    EXPECT_EQ(generate(run.string(), "caf", 40, 0.7, 0, seed), sample);
  }
  EXPECT_GT(most_pieces, 5u) << "streamed as it is made";
  fs::remove_all(f.dir);
}

// So does generate for a prompt's characters, on standard error before the sample.
TEST(LmDocuments, GenerateSaysWhatThePromptLosesToTheTokenizer) {
  const fs::path dir = fs::temp_directory_path() / ("seqforge_prompt_" + std::to_string(getpid()));
  fs::create_directories(dir / "model");
  const std::string tokenizer = (dir / "tokenizer.json").string();
  std::ofstream(tokenizer)
      << R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "<eos>": 2}, "merges": []}})";
  {
    std::ofstream text(dir / "all.txt");
    for (int i = 0; i < 40; ++i) text << "abab\nbaba\n";
  }
  std::ofstream(dir / "model/config.json") << R"({"model_type": "llama", "vocab_size": 3,
      "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
      "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
      "max_position_embeddings": 16, "eos_token_id": 2})";
  const fs::path run = dir / "run";
  std::ostringstream log;
  train(
      Config::parse("data: {task: lm, seq_len: 4}\ntrain: {epochs: 1, max_batches: 2}\n", "c.yaml",
                    {"data.path=" + (dir / "all.txt").string(), "data.tokenizer=" + tokenizer,
                     "model.family=decoder", "model.init_from=" + (dir / "model").string(),
                     "model.from_config=true", "train.run_dir=" + run.string()}),
      log);
  // The run keeps its tokenizer: the one it was given may change or go.
  fs::remove(tokenizer);
  for (const auto& [prompt, lost] : {std::pair{"abcab", 1}, std::pair{"ab?!", 2}}) {
    testing::internal::CaptureStderr();
    generate(run.string(), prompt, 3, 1.0, 0, 1);
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_NE(
        err.find("note: " + std::to_string(lost) +
                 (lost == 1 ? " character of the prompt has" : " characters of the prompt have") +
                 " no token in " + (run / "tokenizer.json").string()),
        std::string::npos)
        << err;
  }
  testing::internal::CaptureStderr();
  generate(run.string(), "abba", 3, 1.0, 0, 1);
  EXPECT_EQ(testing::internal::GetCapturedStderr().find("of the prompt"), std::string::npos);
  EXPECT_EQ(generate((run / "model.safetensors").string(), "abba", 3, 1.0, 0, 1),
            generate(run.string(), "abba", 3, 1.0, 0, 1));  // the run's file reads it too
  fs::remove_all(dir);
}

// A Llama 2 style tokenizer marks spaces with U+2581 and its decoder strips a text's first
// space: the sample is the prompt's tokens and the new ones decoded together, so the space
// between the prompt and the first new word stays. A prompt longer than the model reads is
// followed from its last tokens, with a note.
TEST(LmDocuments, GenerateKeepsTheSpaceAfterThePromptAndSaysWhenItIsCut) {
  const fs::path dir = fs::temp_directory_path() / ("seqforge_space_" + std::to_string(getpid()));
  fs::create_directories(dir / "model");
  const std::string tokenizer = (dir / "tokenizer.json").string();
  std::ofstream(tokenizer) << R"({
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
    "pre_tokenizer": null,
    "post_processor": {"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}},
    "decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "added_tokens": [{"id": 0, "content": "<s>", "special": true}],
    "model": {"type": "BPE", "vocab": {"<s>": 0, "\u2581": 1, "a": 2, "b": 3}, "merges": []}})";
  {
    std::ofstream text(dir / "all.txt");
    for (int i = 0; i < 300; ++i) text << "ab ";
  }
  std::ofstream(dir / "model/config.json") << R"({"model_type": "llama", "vocab_size": 4,
      "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
      "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
      "max_position_embeddings": 12, "tie_word_embeddings": true})";
  const fs::path run = dir / "run";
  std::ostringstream log;
  train(
      Config::parse("data: {task: lm, seq_len: 12}\ntrain: {epochs: 8, batch_size: 4}\n", "c.yaml",
                    {"data.path=" + (dir / "all.txt").string(), "data.tokenizer=" + tokenizer,
                     "model.family=decoder", "model.init_from=" + (dir / "model").string(),
                     "model.from_config=true", "optim.lr=0.02", "train.run_dir=" + run.string()}),
      log);
  std::vector<std::string> pieces;
  const std::string sample = generate(run.string(), "ab", 6, 0.0, 0, 0, 1.0,
                                      [&](std::string_view piece) { pieces.emplace_back(piece); });
  EXPECT_EQ(sample, "ab ab ab") << log.str();
  std::string joined;
  for (const std::string& piece : pieces) joined += piece;
  EXPECT_EQ(joined, sample);
  testing::internal::CaptureStderr();
  EXPECT_EQ(generate(run.string(), "ab ab ab ab ab", 3, 0.0, 0, 0), "ab ab ab ab ab ab");
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("note: the prompt's 16 tokens are more than the 12 the model reads: the "
                     "sample follows its last 12"),
            std::string::npos)
      << err;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace seqforge::lm_documents_test
