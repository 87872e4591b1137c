// The tokenizer's stages on small hand-made tokenizer.json files whose ids are worked out by
// hand, its errors, and the byte-level BPE trainer. The real tokenizers are checked against
// Hugging Face's implementation in tokenizer_hf_test.py.
#include "seqforge/text/tokenizer.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "seqforge/core/error.hpp"

namespace seqforge::text::tokenizer_test {
namespace {

using Ids = std::vector<int32_t>;

// A tokenizer.json with a BPE model over `vocab` and `merges` (JSON texts) and the given stages.
std::string bpe_json(const std::string& vocab, const std::string& merges,
                     const std::string& extra_model = "", const std::string& stages = "") {
  return R"({"model": {"type": "BPE", "vocab": )" + vocab + R"(, "merges": )" + merges +
         extra_model + "}" + stages + "}";
}

Ids ids_of(const Tokenizer& t, const std::string& text, bool special = true) {
  return t.encode(text, special).ids;
}

std::string error_of(const std::string& json) {
  try {
    Tokenizer::from_json(json, "tok.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Tokenizer, MergesByRankThenLeftmost) {
  const std::string vocab = R"({"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5})";
  // "b c" ranks first, so "abc" becomes a + bc and nothing merges those two.
  EXPECT_EQ(ids_of(Tokenizer::from_json(bpe_json(vocab, R"(["b c", "a b", "ab c"])"), "t"), "abc"),
            (Ids{0, 4}));
  EXPECT_EQ(
      ids_of(Tokenizer::from_json(bpe_json(vocab, R"([["a", "b"], ["b", "c"], ["ab", "c"]])"), "t"),
             "abc"),
      (Ids{5}));
  const auto t = Tokenizer::from_json(bpe_json(R"({"a": 0, "aa": 1})", R"(["a a"])"), "t");
  EXPECT_EQ(ids_of(t, "aaa"), (Ids{1, 0}));  // the leftmost pair of equal rank first
  EXPECT_EQ(ids_of(t, "aaaa"), (Ids{1, 1}));
}

TEST(Tokenizer, ByteFallbackAndUnknownCharacters) {
  const std::string vocab = R"({"<unk>": 0, "a": 1, "<0xC3>": 2, "<0xA9>": 3})";
  const auto fallback = Tokenizer::from_json(
      bpe_json(vocab, "[]", R"(, "unk_token": "<unk>", "byte_fallback": true)"), "t");
  EXPECT_EQ(ids_of(fallback, "a\xC3\xA9"), (Ids{1, 2, 3}));  // é as its two bytes
  EXPECT_EQ(ids_of(fallback, "a\xC3\xBC"), (Ids{1, 0}));     // ü: <0xBC> is missing
  const auto fused = Tokenizer::from_json(
      bpe_json(vocab, "[]", R"(, "unk_token": "<unk>", "fuse_unk": true)"), "t");
  EXPECT_EQ(ids_of(fused,
                   "a\xE2\x82\xAC\xE2\x82\xAC"
                   "a"),
            (Ids{1, 0, 1}));
  const auto unfused =
      Tokenizer::from_json(bpe_json(vocab, "[]", R"(, "unk_token": "<unk>")"), "t");
  EXPECT_EQ(ids_of(unfused,
                   "a\xE2\x82\xAC\xE2\x82\xAC"
                   "a"),
            (Ids{1, 0, 0, 1}));
  EXPECT_EQ(unfused.encode("a\xE2\x82\xAC", true).dropped, 0);
  // Without an unknown token a character with no token is left out, and counted.
  const auto without = Tokenizer::from_json(bpe_json(vocab, "[]"), "t");
  const Encoding e = without.encode(
      "a\xE2\x82\xAC\xE2\x82\xAC"
      "a\xC3\xA9",
      true);
  EXPECT_EQ(e.ids, (Ids{1, 1}));
  EXPECT_EQ(e.dropped, 3);
  EXPECT_EQ(without.encode_pair("\xC3\xA9", "a\xC3\xA9", true).dropped, 2);
}

TEST(Tokenizer, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  const std::string vocab = R"({"a": 0, "b": 1, "ab": 2, "abab": 3})";
  EXPECT_EQ(
      ids_of(Tokenizer::from_json(bpe_json(vocab, R"(["a b"])", R"(, "ignore_merges": true)"), "t"),
             "abab"),
      (Ids{3}));
  EXPECT_EQ(ids_of(Tokenizer::from_json(bpe_json(vocab, R"(["a b"])"), "t"), "abab"), (Ids{2, 2}));
}

TEST(Tokenizer, SplitKeepsDelimitersAsEachBehaviourSays) {
  // Whole pieces are looked up as they are (ignore_merges), so the ids show the cuts.
  const std::string vocab =
      R"({"a": 0, "b": 1, "c": 2, "-": 3, "a-": 4, "b-": 5, "-b": 6, "-c": 7, "--": 8})";
  const auto split = [&](const std::string& behavior) {
    const std::string stages = R"(, "pre_tokenizer": {"type": "Split", "pattern": {"String": "-"},
        "behavior": ")" + behavior +
                               R"(", "invert": false})";
    return ids_of(
        Tokenizer::from_json(bpe_json(vocab, "[]", R"(, "ignore_merges": true)", stages), "t"),
        "a-b--c");
  };
  EXPECT_EQ(split("Removed"), (Ids{0, 1, 2}));
  EXPECT_EQ(split("Isolated"), (Ids{0, 3, 1, 3, 3, 2}));
  EXPECT_EQ(split("MergedWithPrevious"), (Ids{4, 5, 3, 2}));
  EXPECT_EQ(split("MergedWithNext"), (Ids{0, 6, 3, 7}));
  EXPECT_EQ(split("Contiguous"), (Ids{0, 3, 1, 8, 2}));
}

TEST(Tokenizer, MetaspacePrependsAtTheStartOrEverywhere) {
  const std::string vocab =
      "{\"\xE2\x96\x81"
      "a\": 0, \"a\": 1, \"\xE2\x96\x81"
      "b\": 2, \"b\": 3, \"<x>\": 4}";
  const auto with = [&](const char* scheme) {
    const std::string stages =
        R"(, "added_tokens": [{"id": 4, "content": "<x>", "special": true}],
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": ")" +
        std::string(scheme) + R"(", "split": true},
        "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": ")" +
        std::string(scheme) + R"("})";
    return Tokenizer::from_json(bpe_json(vocab, "[]", R"(, "ignore_merges": true)", stages), "t");
  };
  EXPECT_EQ(ids_of(with("first"), "a<x>b"), (Ids{0, 4, 3}));
  EXPECT_EQ(ids_of(with("always"), "a<x>b"), (Ids{0, 4, 2}));
  EXPECT_EQ(ids_of(with("never"), "a<x>b"), (Ids{1, 4, 3}));
  EXPECT_EQ(with("first").decode(Ids{0, 4, 2}), "a<x> b");
}

TEST(Tokenizer, AddedTokensTakeTheWhitespaceTheyStrip) {
  const std::string vocab =
      R"({"a": 0, "b": 1, "a ": 2, " b": 3, "<m>": 4, "<": 5, "m": 6, ">": 7})";
  const auto with = [&](const char* strip) {
    const std::string stages =
        R"(, "added_tokens": [{"id": 4, "content": "<m>", "special": false, )" +
        std::string(strip) + "}]";
    return Tokenizer::from_json(bpe_json(vocab, "[]", R"(, "ignore_merges": true)", stages), "t");
  };
  EXPECT_EQ(ids_of(with(R"("lstrip": true, "rstrip": true)"), "a <m> b"), (Ids{0, 4, 1}));
  EXPECT_EQ(ids_of(with(R"("lstrip": false, "rstrip": false)"), "a <m> b"), (Ids{2, 4, 3}));
  // A single-word token is no match where word characters touch it.
  EXPECT_EQ(ids_of(with(R"("single_word": true)"), "a<m>b"), (Ids{0, 5, 6, 7, 1}));
  EXPECT_EQ(ids_of(with(R"("single_word": true)"), "a <m> b"), (Ids{2, 4, 3}));
}

// A single-word token's neighbours are words by Unicode's \w, as Hugging Face's tokenizers test
// them (alphabetic, marks, decimal digits, connectors, joiners; not other numbers), and a match
// it discards is passed over whole, as one left-to-right pass of non-overlapping matches does.
TEST(Tokenizer, SingleWordTokensAreAloneByUnicodesWordCharacters) {
  const std::string vocab = R"({"w": 0, "<unk>": 1, "a": 2, "b": 3, "c": 4})";
  const std::string stages = R"(, "added_tokens": [
      {"id": 5, "content": "ww", "special": false, "single_word": true},
      {"id": 6, "content": "ab", "special": false, "single_word": true},
      {"id": 7, "content": "bc", "special": false}])";
  const Tokenizer t =
      Tokenizer::from_json(bpe_json(vocab, "[]", R"(, "unk_token": "<unk>")", stages), "t");
  EXPECT_EQ(ids_of(t, "ww"), (Ids{5}));
  EXPECT_EQ(ids_of(t, "www"), (Ids{0, 0, 0}));
  EXPECT_EQ(ids_of(t, "ww\u0301"), (Ids{0, 0, 1}));      // a combining mark
  EXPECT_EQ(ids_of(t, "c\u200dww"), (Ids{4, 1, 0, 0}));  // zero-width joiner
  EXPECT_EQ(ids_of(t, "ww\u203fc"), (Ids{0, 0, 1, 4}));  // connector punctuation
  EXPECT_EQ(ids_of(t, "\u00bdww"), (Ids{1, 5}));         // a vulgar fraction: no digit
  EXPECT_EQ(ids_of(t, "ww\u00b2"), (Ids{5, 1}));         // a superscript: no digit
  EXPECT_EQ(ids_of(t, "ww\u0663"), (Ids{0, 0, 1}));      // an Arabic-Indic digit
  EXPECT_EQ(ids_of(t, "cabc"), (Ids{4, 2, 3, 4}));       // "ab" discarded, "bc" never seen
  EXPECT_EQ(ids_of(t, "abc"), (Ids{2, 3, 4}));           // the same at the text's start
}

TEST(Tokenizer, PairsFollowTheTemplateWithTheirTypeIds) {
  const std::string stages = R"(, "added_tokens": [{"id": 2, "content": "<s>", "special": true},
      {"id": 3, "content": "</s>", "special": true}],
    "post_processor": {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
               {"SpecialToken": {"id": "</s>", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [2], "tokens": ["<s>"]},
                         "</s>": {"id": "</s>", "ids": [3], "tokens": ["</s>"]}}})";
  const auto t = Tokenizer::from_json(bpe_json(R"({"a": 0, "b": 1})", "[]", "", stages), "t");
  EXPECT_EQ(ids_of(t, "ab"), (Ids{2, 0, 1}));
  const Encoding pair = t.encode_pair("a", "bb");
  EXPECT_EQ(pair.ids, (Ids{2, 0, 3, 1, 1}));
  EXPECT_EQ(pair.type_ids, (std::vector<uint8_t>{0, 0, 0, 1, 1}));
  EXPECT_EQ(pair.special, (std::vector<uint8_t>{1, 0, 1, 0, 0}));
  const Encoding plain = t.encode_pair("a", "bb", false);
  EXPECT_EQ(plain.ids, (Ids{0, 1, 1}));
  EXPECT_EQ(plain.type_ids, (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ(t.decode(pair.ids, /*skip_special_tokens=*/true), "a b b");  // no decoder: spaces
  EXPECT_TRUE(t.is_special(2));
  EXPECT_FALSE(t.is_special(0));
  EXPECT_EQ(t.token_to_id("</s>"), 3);
  EXPECT_EQ(t.vocab_size(), 4);
}

TEST(Tokenizer, DecodersJoinBytesAndSpaces) {
  const std::string stages = R"(, "decoder": {"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})";
  const auto t = Tokenizer::from_json(
      bpe_json("{\"\xE2\x96\x81Hi\": 0, \"<0xC3>\": 1, \"<0xA9>\": 2, \"\xE2\x96\x81you\": 3}",
               "[]", "", stages),
      "t");
  EXPECT_EQ(t.decode(Ids{0, 1, 2, 3}), "Hi\xC3\xA9 you");
  EXPECT_EQ(t.decode(Ids{0, 1, 3}), "Hi\xEF\xBF\xBD you");  // a lone lead byte: U+FFFD
}

TEST(Tokenizer, ByteLevelRoundTripsAnyText) {
  BpeTrainOptions options;
  options.vocab_size = 300;
  options.min_frequency = 1;
  const std::string text =
      "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"
      "The slings and arrows of outrageous fortune,\n\xC3\xA9t\xC3\xA9 \xF0\x9F\x98\x80 12345\n";
  const std::string json = train_byte_level_bpe(text, options);
  EXPECT_EQ(json, train_byte_level_bpe(text, options));  // the same file every time
  const auto t = Tokenizer::from_json(json, "trained");
  EXPECT_EQ(t.vocab_size(), 300);
  EXPECT_EQ(t.token_to_id("<|endoftext|>"), 0);
  for (const std::string& s : {text, std::string("unseen words \x01\x7f \xE4\xBD\xA0\xE5\xA5\xBD"),
                               std::string("  "), std::string()})
    EXPECT_EQ(t.decode(t.encode(s).ids), s);
  EXPECT_LT(t.encode(text).ids.size(), text.size() * 7 / 10);  // the learnt merges apply
  // Bytes that are no UTF-8: one U+FFFD per maximal invalid part, as Rust's from_utf8_lossy and
  // Python's "replace" (byte-level characters: U+00BF is byte BF, U+00E2 E2, U+00C0 C0, ...).
  const auto bytes = [&](const std::vector<std::string>& chars) {
    Ids ids;
    for (const std::string& c : chars) ids.push_back(t.token_to_id(c).value());
    return t.decode(ids);
  };
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(bytes({"\xC2\xBF", "\xC2\xBF"}), fffd + fffd);       // BF BF
  EXPECT_EQ(bytes({"\xC3\x80", "\xC2\xA9"}), fffd + fffd);       // C0 A9: overlong
  EXPECT_EQ(bytes({"\xC3\xA2", "\xC2\xBF"}), fffd);              // E2 BF, cut short
  EXPECT_EQ(bytes({"\xC3\xA2", "\xC2\xBF", "A"}), fffd + "A");   // E2 BF 41
  EXPECT_EQ(bytes({"\xC3\xB0", "\xC2\xA9", "\xC2\xBF"}), fffd);  // F0 A9 BF, cut short
  EXPECT_EQ(bytes({"\xC3\xB0", "\xC4\xB1"}), fffd + fffd);       // F0 8F (U+0131): below U+10000

  options.vocab_size = 200;
  EXPECT_THROW(train_byte_level_bpe(text, options), Error);
}

// The vocab and merges are read as they stream past; what that reading does not take (a second
// model, a repeated key, a malformed entry) goes through the whole tree with the same result.
TEST(Tokenizer, StreamedAndTreeReadingsAgree) {
  const std::string vocab = R"({"a": 0, "b": 1, "ab": 2, "c": 3})";
  const auto plain = Tokenizer::from_json(bpe_json(vocab, R"(["a b"])"), "t");
  const auto pairs = Tokenizer::from_json(bpe_json(vocab, R"([["a", "b"]])"), "t");
  // A repeated key keeps its last value, in the root, the model and the vocab.
  const auto second_model =
      Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"z": 0}, "merges": []}, )" +
                               bpe_json(vocab, R"(["a b"])").substr(1),
                           "t");
  const auto second_vocab =
      Tokenizer::from_json(bpe_json(R"({"q": 0}, "vocab": )" + vocab, R"(["a b"])"), "t");
  const auto second_merges =
      Tokenizer::from_json(bpe_json(vocab, R"(["b a"], "merges": ["a b"])"), "t");
  const auto repeated_token = Tokenizer::from_json(
      bpe_json(R"({"a": 3, "b": 1, "ab": 2, "c": 0, "a": 0, "c": 3})", R"(["a b"])"), "t");
  for (const Tokenizer* t :
       {&plain, &pairs, &second_model, &second_vocab, &second_merges, &repeated_token}) {
    EXPECT_EQ(ids_of(*t, "abcab"), (Ids{2, 3, 2}));
    EXPECT_EQ(t->vocab_size(), 4);
    EXPECT_EQ(t->token_to_id("a"), 0);
  }

  const auto error_has = [](const std::string& json, const std::string& part) {
    const std::string e = error_of(json);
    EXPECT_NE(e.find(part), std::string::npos) << json << "\n" << e;
  };
  error_has(bpe_json(R"({"a": 0.5})", "[]"), "model.vocab: token 'a' has id 0.5");
  error_has(bpe_json(R"({"a": -1})", "[]"), "model.vocab: token 'a' has id -1");
  error_has(bpe_json(R"({"a": 18446744073709551615})", "[]"),
            "token 'a' has id 18446744073709551615");
  error_has(bpe_json(R"({"a": "0"})", "[]"), R"(token 'a' has id "0")");
  error_has(bpe_json(R"({"a": {"b": 0}})", "[]"), "token 'a' has id {");
  error_has(bpe_json(R"(["a"])", "[]"), "model.vocab: expected an object");
  error_has(bpe_json(vocab, R"([["a", "b", "c"]])"), R"(model.merges[0]: expected "a b" or)");
  error_has(bpe_json(vocab, R"([["a"]])"), R"(model.merges[0]: expected "a b" or)");
  error_has(bpe_json(vocab, R"(["a b", 7])"), R"(model.merges[1]: expected "a b" or)");
  error_has(bpe_json(vocab, R"(["a b c"])"), "model.merges[0]: 'a b c' is not two tokens");
  error_has(bpe_json(vocab, R"({"a b": 1})"), "model.merges: expected a list");
  error_has(R"({"model": {"type": "BPE", "merges": []}})", "model.vocab: expected an object");
  // A syntax error after the reading stopped at a malformed entry.
  error_has(bpe_json(R"({"a": 0.5})", "[]") + ",", "tok.json: not valid JSON");
  error_has(bpe_json(vocab, "[\"a b\"") + "}", "tok.json: not valid JSON");
}

TEST(Tokenizer, BadFilesAreOneErrorNamingThePlace) {
  const std::string ok_vocab = R"({"a": 0, "b": 1, "ab": 2})";
  // Stages nested as deep as Hugging Face reads build; one level more is refused at once.
  const auto nested = [&](int levels) {
    std::string stage = R"({"type": "Lowercase"})";
    for (int i = 1; i < levels; ++i)
      stage = R"({"type": "Sequence", "normalizers": [)" + stage + "]}";
    return bpe_json(ok_vocab, "[]", "", R"(, "normalizer": )" + stage);
  };
  EXPECT_EQ(ids_of(Tokenizer::from_json(nested(62), "t"), "AB"), (Ids{0, 1}));
  EXPECT_NE(error_of(nested(65)).find("tok.json: nested deeper than 128 levels (byte "),
            std::string::npos)
      << error_of(nested(65));
  EXPECT_NE(error_of("{").find("tok.json: not valid JSON"), std::string::npos) << error_of("{");
  EXPECT_NE(error_of(R"({"model": {"type": "WordPiece", "vocab": {}}})")
                .find("model.type: model type 'WordPiece' is not supported"),
            std::string::npos);
  EXPECT_NE(error_of(bpe_json(ok_vocab, R"(["a c"])")).find("model.merges[0]: 'c' is not in the"),
            std::string::npos);
  EXPECT_NE(error_of(bpe_json(ok_vocab, R"(["a", "b"])")).find("model.merges[0]: 'a' is not two"),
            std::string::npos);
  EXPECT_NE(error_of(bpe_json(ok_vocab, "[]", "", R"(, "truncation": {"max_length": 8})"))
                .find("truncation is set"),
            std::string::npos);
  EXPECT_NE(error_of(bpe_json(ok_vocab, "[]", "", R"(, "foo": 1)")).find("unknown field 'foo'"),
            std::string::npos);
  EXPECT_NE(error_of(bpe_json(ok_vocab, "[]", "", R"(, "normalizer": {"type": "Precompiled"})"))
                .find("normalizer: normalizer type 'Precompiled' is not supported"),
            std::string::npos);
  EXPECT_NE(
      error_of(bpe_json(ok_vocab, "[]", "",
                        R"(, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(a"}})"))
          .find("pre_tokenizer.pattern: the pattern '(a' does not compile"),
      std::string::npos);
  EXPECT_NE(
      error_of(bpe_json(ok_vocab, "[]", "", R"(, "post_processor": {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>"}}], "pair": [],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [99]}}})"))
          .find("special token id 99 is outside the vocabulary"),
      std::string::npos);
  EXPECT_NE(error_of(bpe_json(R"({"a": 0, "b": 0})", "[]")).find("id 0 is given to"),
            std::string::npos);
  EXPECT_NE(error_of(bpe_json(ok_vocab, "[]", R"(, "dropout": 0.1)")).find("dropout"),
            std::string::npos);

  const auto t = Tokenizer::from_json(bpe_json(ok_vocab, R"(["a b"])"), "t");
  try {
    t.encode("ab\xC3");
    ADD_FAILURE() << "a truncated character was encoded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("invalid UTF-8 at byte offset 2"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(t.encode("a\xFF"
                        "b"),
               Error);
  EXPECT_THROW(t.encode("\xED\xA0\x80"), Error);  // a surrogate
  EXPECT_THROW(t.encode("\xC0\xAF"), Error);      // an overlong form
  EXPECT_THROW(t.decode(Ids{3}), Error);
}

// A pair cut longest_first as Hugging Face's fast tokenizers cut it (the tokenizers crate's own
// table, max_length 7, inputs of 0, 2, 4 and 8 tokens), and a single text.
TEST(Tokenizer, PairsAreCutLongestFirstAsHuggingFacesFastTokenizers) {
  const size_t sizes[] = {0, 2, 4, 8};
  const std::pair<size_t, size_t> want[4][4] = {{{0, 0}, {0, 2}, {0, 4}, {0, 7}},
                                                {{2, 0}, {2, 2}, {2, 4}, {2, 5}},
                                                {{4, 0}, {4, 2}, {3, 4}, {3, 4}},
                                                {{7, 0}, {5, 2}, {4, 3}, {3, 4}}};
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j)
      EXPECT_EQ(truncate_longest_first(sizes[i], sizes[j], 7), want[i][j])
          << sizes[i] << " and " << sizes[j];
  EXPECT_EQ(truncate_longest_first(12, 12, 23), (std::pair<size_t, size_t>{11, 12}));
  EXPECT_EQ(truncate_longest_first(30, 20, 10), (std::pair<size_t, size_t>{5, 5}));
  EXPECT_EQ(truncate_longest_first(30, 0, 10), (std::pair<size_t, size_t>{10, 0}));
}

}  // namespace
}  // namespace seqforge::text::tokenizer_test
