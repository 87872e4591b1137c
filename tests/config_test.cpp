// The training config: parsing, overrides, types, unknown keys, the resolved dump, and the
// reference docs/config.md, which must match the key table.
#include "seqforge/train/config.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <map>
#include <sstream>

#include "seqforge/core/error.hpp"
#include "seqforge/train/trainer.hpp"
#include "test_util.hpp"

namespace seqforge::config_test {
namespace {

using test::error_of;

TEST(Config, ReadsNestedKeysDefaultsAndOverrides) {
  const Config c = Config::parse(
      "data:\n  path: x.csv\n  features: [a, b]\n  split: {train: 0.6}\nmodel:\n  hidden: 32\n",
      "cfg.yaml", {"train.epochs=3", "model.bidirectional=true", "data.targets=[y]"});
  EXPECT_EQ(c.str("data.path"), "x.csv");
  EXPECT_EQ(c.list("data.features"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(c.list("data.targets"), (std::vector<std::string>{"y"}));
  EXPECT_DOUBLE_EQ(c.number("data.split.train"), 0.6);
  EXPECT_DOUBLE_EQ(c.number("data.split.val"), 0.1);  // default
  EXPECT_EQ(c.integer("model.hidden"), 32);
  EXPECT_EQ(c.integer("train.epochs"), 3);
  EXPECT_TRUE(c.boolean("model.bidirectional"));
  EXPECT_TRUE(c.is_set("train.epochs"));
  EXPECT_FALSE(c.is_set("train.seed"));
  // The resolved dump parses back to the same values, defaults included.
  const Config again = Config::parse(c.resolved_yaml(), "resolved");
  for (const auto& k : config_keys()) EXPECT_EQ(again.str(k.path), c.str(k.path)) << k.path;
}

// An override may give a section as a map; a key's origin (file line or override) is what
// errors about its value name.
TEST(Config, SectionOverridesAndWhereAValueCameFrom) {
  const Config c = Config::parse("train:\n  epochs: 4\n", "cfg.yaml",
                                 {"train.early_stopping={patience: 2, min_delta: 0.5}"});
  EXPECT_EQ(c.integer("train.early_stopping.patience"), 2);
  EXPECT_DOUBLE_EQ(c.number("train.early_stopping.min_delta"), 0.5);
  EXPECT_EQ(c.origin("train.epochs"), "cfg.yaml:2");
  EXPECT_EQ(c.origin("train.early_stopping.patience"),
            "override 'train.early_stopping={patience: 2, min_delta: 0.5}'");
  EXPECT_EQ(c.origin("train.seed"), "cfg.yaml");  // a default
  const std::string e =
      error_of([] { Config::parse("", "cfg.yaml", {"train.early_stopping={patiance: 2}"}); });
  EXPECT_NE(e.find("unknown key 'train.early_stopping.patiance'"), std::string::npos) << e;
}

// Settings the model ignores are warned about when given, not when a resumed run's resolved
// config lists them at their defaults.
TEST(Config, IgnoredSettingsOnlyWhenGiven) {
  const Config given = Config::parse("model:\n  heads: 8\nadapter:\n  rank: 4\n", "cfg.yaml");
  EXPECT_EQ(ignored_settings(given).size(), 2u);
  const Config resolved =
      Config::parse(Config::parse("train:\n  epochs: 2\n", "cfg.yaml").resolved_yaml(), "r");
  EXPECT_TRUE(ignored_settings(resolved).empty());
  // Forecasting keys that another setting makes moot.
  const Config moot = Config::parse(
      "data:\n  task: classify\n  season: 24\n  normalize_fallback: pooled\ntrain:\n  "
      "huber_delta: 2\n",
      "cfg.yaml");
  EXPECT_EQ(ignored_settings(moot),
            (std::vector<std::string>{
                "data.season is for forecasters' seasonal-naive baseline; data.task is classify: "
                "it is ignored",
                "train.huber_delta is set but train.loss is mse: it is ignored",
                "data.normalize_fallback is set but data.normalize_per is all (one scaler for "
                "every series): it is ignored"}));
  // Columns of another task's: a forecast's class column still keeps it out of the default
  // features, and a classifier has no targets.
  EXPECT_EQ(ignored_settings(Config::parse("data:\n  class_column: kind\n", "cfg.yaml")),
            (std::vector<std::string>{
                "data.class_column is for classifiers; data.task is forecast: it is ignored, but "
                "for keeping column 'kind' out of the features (data.features is empty: every "
                "other column)"}));
  EXPECT_EQ(ignored_settings(Config::parse(
                "data:\n  task: classify\n  targets: [a]\n  label_column: b\n", "cfg.yaml")),
            (std::vector<std::string>{
                "data.targets is for data.task forecast; data.task is classify, whose truth is "
                "its class: it is ignored",
                "data.label_column is for data.label direction and volatility; data.label is "
                "column (the class is data.class_column's): it is ignored"}));
  // Keys of the other kind of data: a window's length is data.lookback, a text's data.seq_len.
  const Config text = Config::parse(
      "data:\n  task: charlm\n  lookback: 64\n  normalize: minmax\n  seq_len: 64\n", "c.yaml");
  EXPECT_EQ(ignored_settings(text),
            (std::vector<std::string>{"data.lookback is for time series; data.task is charlm, "
                                      "whose sequences are data.seq_len long: it is ignored",
                                      "data.normalize is for time series; data.task is charlm: "
                                      "it is ignored"}));
  const Config series =
      Config::parse("data:\n  seq_len: 256\n  mask_ratio: 0.3\n  label: direction\n", "c.yaml");
  EXPECT_EQ(ignored_settings(series),
            (std::vector<std::string>{
                "data.seq_len is for text (charlm, lm, text_classify); data.task is forecast, "
                "whose windows are data.lookback long: it is ignored",
                "data.label is for data.task classify; data.task is forecast: it is ignored",
                "data.mask_ratio is for data.task mae (the masked autoencoder); data.task is "
                "forecast: it is ignored"}));
  // Settings of a schedule, optimizer or augmentation the run does not use, and a mode that
  // keeps the worst epoch.
  const Config unused = Config::parse(
      "optim: {kind: sgd, beta2: 0.9}\ntrain: {schedule: cosine, gamma: 0.5, early_stopping: "
      "{mode: max}}\naugment: {time_warp: {knots: 8}}\n",
      "c.yaml");
  EXPECT_EQ(ignored_settings(unused),
            (std::vector<std::string>{
                "train.gamma is for train.schedule step and plateau; train.schedule is cosine: "
                "it is ignored",
                "optim.beta2 is for optim.kind adam and adamw; optim.kind is sgd: it is ignored",
                "augment.time_warp.knots is set but augment.time_warp.p is 0: time_warp never "
                "applies",
                "train.early_stopping.mode is max but val_loss is better lower: the run keeps and "
                "waits for its worst epochs (mode auto picks min)"}));
  // Keys of another model family or split, and a cache's size without the cache.
  EXPECT_EQ(ignored_settings(Config::parse(
                "model: {bias: false, embedding: 7}\ndata: {split: {mode: random, context: "
                "strict}}\naugment: {cache_versions: 2}\n",
                "c.yaml")),
            (std::vector<std::string>{
                "model.bias is for transformers; a recurrent layer keeps its biases (as nn.LSTM's "
                "default): it is ignored",
                "model.embedding is for characters and transformers; a recurrent forecast model "
                "reads its features as they are: it is ignored",
                "data.split.context is for time splits; data.split.mode is random: it is ignored",
                "augment.cache_versions is set but augment.cache is false: nothing is cached"}));
  EXPECT_TRUE(
      ignored_settings(Config::parse("data: {task: charlm}\nmodel: {embedding: 16}\n", "c.yaml"))
          .empty());
  EXPECT_TRUE(ignored_settings(Config::parse("data: {task: classify}\ntrain: {early_stopping: "
                                             "{monitor: val_accuracy, mode: max}}\n",
                                             "c.yaml"))
                  .empty());
  EXPECT_TRUE(
      ignored_settings(Config::parse("data:\n  task: text_classify\n  text_columns: [a, b]\n  "
                                     "separator: ' | '\n  class_column: c\n  seq_len: 64\n",
                                     "c.yaml"))
          .empty());
}

TEST(Config, UnknownKeysSuggestTheClosest) {
  const std::string e = error_of([] { Config::parse("model:\n  hiden: 3\n", "cfg.yaml"); });
  EXPECT_NE(e.find("cfg.yaml:2"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key 'model.hiden'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'model.hidden'"), std::string::npos) << e;
  const std::string o = error_of([] { Config::parse("", "cfg.yaml", {"train.epoch=3"}); });
  EXPECT_NE(o.find("did you mean 'train.epochs'"), std::string::npos) << o;
  EXPECT_NE(error_of([] { Config::parse("nonsense: 1\n", "cfg.yaml"); }).find("unknown key"),
            std::string::npos);
  // Other trainers' names get seqforge's.
  const std::string lr =
      error_of([] { Config::parse("train:\n  learning_rate: 0.1\n", "cfg.yaml"); });
  EXPECT_NE(lr.find("unknown key 'train.learning_rate' (seqforge's name: 'optim.lr')"),
            std::string::npos)
      << lr;
  // So do PyTorch's and Hugging Face's module arguments.
  auto hint = [](const std::string& key) {
    return error_of([&] { Config::parse("", "cfg.yaml", {key + "=2"}); });
  };
  EXPECT_NE(hint("model.num_layers").find("(seqforge's name: 'model.layers')"), std::string::npos);
  EXPECT_NE(hint("model.n_head").find("(seqforge's name: 'model.heads')"), std::string::npos);
  EXPECT_NE(hint("model.hidden_size")
                .find("'model.hidden' for a recurrent layer, 'model.embedding' for a transformer"),
            std::string::npos);
  EXPECT_NE(hint("model.type").find("'model.cell' for the recurrent cell"), std::string::npos);
  const std::string accumulate =
      error_of([] { Config::parse("", "cfg.yaml", {"train.gradient_accumulation_steps=4"}); });
  EXPECT_NE(accumulate.find("train.micro_batch_size the examples run at once"), std::string::npos)
      << accumulate;
  // A section's name mistyped gets the section, not a key that ends alike.
  EXPECT_NE(error_of([] {
              Config::parse("modle:\n  hidden: 3\n", "cfg.yaml");
            }).find("unknown key 'modle' (did you mean 'model'?)"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              Config::parse("traing:\n  epochs: 3\n", "cfg.yaml");
            }).find("(did you mean 'train'?)"),
            std::string::npos);
  EXPECT_EQ(config_key_suggestion("optim.lrr"), " (did you mean 'optim.lr'?)");
  EXPECT_EQ(closest_word("n_trails", {"name", "n_trials", "timeout"}), "n_trials");
  EXPECT_EQ(closest_word("sampler", {"name", "n_trials"}), "");
}

// A quote left open takes in the lines after it (YAML folds them into the value): the value that
// swallowed a key is named, not a key the swallowed lines would have set.
TEST(Config, AQuoteLeftOpenIsNamed) {
  const std::string e = error_of([] {
    Config::parse("data:\n  path: \"/tmp/tiny.txt\n  task: charlm\n  seq_len: 32\n", "cfg.yaml");
  });
  EXPECT_EQ(e,
            "cfg.yaml:2: data.path: the quoted value takes in 'task: charlm', a key and its value "
            "(a quote left open?)");
  // A separator may hold such text; a plain value with a colon is the user's.
  EXPECT_EQ(Config::parse("data:\n  separator: \" Answer: \"\n", "cfg.yaml").str("data.separator"),
            " Answer: ");
  EXPECT_EQ(Config::parse("data:\n  date_column: \"time\"\n", "cfg.yaml").str("data.date_column"),
            "time");
}

// One setting, one spelling: configs that differ only in how they write a number or a truth
// value compare equal (a resume, a study's trials), and config.resolved.yaml writes the one.
TEST(Config, NumbersAndTruthValuesHaveOneSpelling) {
  const Config a = Config::parse(
      "data:\n  split: {train: 0.70}\nmodel:\n  bidirectional: on\ntrain:\n  seed: 007\n"
      "optim:\n  lr: 1e-3\n",
      "a.yaml");
  const Config b = Config::parse(
      "data:\n  split: {train: 0.7}\nmodel:\n  bidirectional: true\ntrain:\n  seed: 7\n"
      "optim:\n  lr: 0.001\n",
      "b.yaml");
  for (const char* key : {"data.split.train", "model.bidirectional", "train.seed", "optim.lr"})
    EXPECT_EQ(a.str(key), b.str(key)) << key;
  EXPECT_EQ(a.str("data.split.train"), "0.7");
  EXPECT_EQ(a.str("model.bidirectional"), "true");
  // A default reads as the same value given.
  EXPECT_EQ(Config::parse("", "c.yaml").str("augment.jitter.p"),
            Config::parse("augment: {jitter: {p: 0}}", "d.yaml").str("augment.jitter.p"));
  EXPECT_FALSE(Config::parse("model: {bidirectional: no}", "e.yaml")
                   .differs_from_default("model.bidirectional"));
  EXPECT_EQ(canonical_value("optim.lr", "1e-3"), "0.001");
  EXPECT_EQ(canonical_value("data.path", "1e-3"), "1e-3");
  // An integer past what 64 bits hold is out of the key's range, not "not an integer".
  EXPECT_EQ(error_of([] { Config::parse("model: {hidden: 9223372036854775808}", "f.yaml"); }),
            "f.yaml:1: model.hidden must be in [1, 65536], got 9223372036854775808");
}

// PyYAML writes a value of line breaks as blank lines between quotes: YAML folds each blank line
// into one line break, and one line end alone into a space.
TEST(Config, QuotedBlankLinesAreLineBreaks) {
  const auto separator = [](const std::string& quoted) {
    return Config::parse("data:\n  separator: " + quoted + "\n", "cfg.yaml").str("data.separator");
  };
  EXPECT_EQ(separator("'\n\n    '"), "\n");
  EXPECT_EQ(separator("\"\n\n\n    \""), "\n\n");
  EXPECT_EQ(separator("'\n    '"), " ");
  EXPECT_EQ(separator("'  '"), "  ");
  EXPECT_EQ(separator("' \n\n    x'"), "\nx");
  EXPECT_EQ(separator("\"\\n\""), "\n");
}

// A key that is a list or a map is refused with the line, not a YAML library message.
TEST(Config, KeysThatAreNotNamesAreRefused) {
  EXPECT_EQ(error_of([] { Config::parse("train: {}\n[a, b]: 1\n", "cfg.yaml"); }),
            "cfg.yaml:2: a key must be a name, not a list");
  EXPECT_EQ(error_of([] { Config::parse("model:\n  {x: 1}: 2\n", "cfg.yaml"); }),
            "cfg.yaml:2: a key must be a name, not a map");
  EXPECT_EQ(error_of([] { Config::parse("", "cfg.yaml", {"model={[x]: 1}"}); }),
            "override 'model={[x]: 1}': a key must be a name, not a list");
}

// A config is one YAML document: a second one, and a key given twice, would be read as nothing
// and as the last value without a word; both are refused naming the line.
TEST(Config, OneDocumentAndEachKeyOnce) {
  for (const char* one : {"%YAML 1.2\n---\ntrain: {epochs: 2}\n", "--- {train: {epochs: 2}}\n",
                          "train: {epochs: 2}\n---\n# nothing more\n", "train: {epochs: 2}\n...\n"})
    EXPECT_EQ(Config::parse(one, "cfg.yaml").integer("train.epochs"), 2) << one;
  EXPECT_EQ(
      error_of([] { Config::parse("train: {epochs: 2}\n---\ntrain: {epochs: 3}\n", "c.yaml"); }),
      "c.yaml:2: a second YAML document ('---'): a config is one document; merge them");
  EXPECT_EQ(error_of([] {
              Config::parse("train: {epochs: 2}\n...\n--- {model: {hidden: 3}}\n", "c.yaml");
            }),
            "c.yaml:2: a second YAML document ('---'): a config is one document; merge them");
  EXPECT_EQ(
      error_of([] { Config::parse("model:\n  hidden: 8\n  layers: 2\n  hidden: 16\n", "c.yaml"); }),
      "c.yaml:4: 'model.hidden' is given twice");
}

// A tag of YAML's core schema reads as the value; any other tag is refused naming its line, in
// the tune section too, rather than dropped without a word.
TEST(Config, TagsOutsideTheCoreSchemaAreRefused) {
  const Config c = Config::parse(
      "model: !!map {hidden: !!int 8}\noptim: {lr: !!float 1e-3}\n"
      "data: {targets: !!seq [!!str y]}\n",
      "cfg.yaml");
  EXPECT_EQ(c.integer("model.hidden"), 8);
  EXPECT_EQ(c.number("optim.lr"), 1e-3);
  EXPECT_EQ(c.list("data.targets"), std::vector<std::string>{"y"});
  EXPECT_EQ(
      error_of([] { Config::parse("train: {epochs: 2}\nmodel: {hidden: !wide 8}\n", "c.yaml"); }),
      "c.yaml:2: the YAML tag '!wide' asks for a reading a config does not have; remove it");
  EXPECT_EQ(error_of([] {
              Config::parse("tune:\n  space:\n    optim.lr: !!python/object {}\n", "c.yaml");
            }),
            "c.yaml:3: the YAML tag 'tag:yaml.org,2002:python/object' asks for a reading a config "
            "does not have; remove it");
  EXPECT_EQ(error_of([] { Config::parse("", "c.yaml", {"model.hidden=!w 8"}); }),
            "override 'model.hidden=!w 8': the YAML tag '!w' asks for a reading a config does not "
            "have; remove it");
}

// A word YAML reads as null, in a list of texts, is said to need quotes.
TEST(Config, ANullWordInAListSaysToQuoteIt) {
  EXPECT_EQ(error_of([] { Config::parse("data: {missing_values: [NULL, -999]}\n", "c.yaml"); }),
            "c.yaml:1: data.missing_values: expected a list of strings, got an empty entry (entry "
            "0; YAML reads null, Null, NULL and ~ as none: quote one meant as text, \"NULL\")");
  EXPECT_EQ(Config::parse("data: {missing_values: [\"NULL\", -999]}\n", "c.yaml")
                .list("data.missing_values"),
            (std::vector<std::string>{"NULL", "-999"}));
}

// A long override is quoted cut short in its error, at a character's first byte.
TEST(Config, ALongOverrideIsQuotedCutShort) {
  // "model.hiden=" and 104 letters: 116 bytes, then an "e" with an acute accent in two bytes.
  const std::string o = "model.hiden=" + std::string(104, 'x') + "\xc3\xa9" + std::string(1e5, 'x');
  const std::string e = error_of([&] { Config::parse("", "c.yaml", {o}); });
  EXPECT_EQ(e.substr(0, e.find(": unknown key")), "override '" + o.substr(0, 116) + "...'");
  EXPECT_LT(e.size(), 300u);
}

// YAML is Unicode text: other bytes are refused naming the line (the resolved config could not
// write such a value back), and a value with control characters, written back quoted and
// escaped, reads back the same.
TEST(Config, TextThatIsNotUtf8IsRefusedAndControlCharactersReadBack) {
  EXPECT_EQ(error_of([] { Config::parse("data:\n  path: caf\xe9.csv\n", "c.yaml"); }),
            "c.yaml:2: not UTF-8 text (byte 17); save the config as UTF-8");
  EXPECT_EQ(error_of([] { Config::parse("", "c.yaml", {"data.path=caf\xc3"}); }),
            "override 'data.path=caf\\xc3': not UTF-8 text (byte 13)");
  const Config c = Config::parse("data:\n  path: \"a\\rb\\x01c\"\n  separator: \"\\r\\n\"\n",
                                 "c.yaml", {"data.eos_token=caf\xc3\xa9"});
  EXPECT_EQ(c.str("data.path"),
            "a\rb\x01"
            "c");
  const std::string resolved = c.resolved_yaml();
  const Config back = Config::parse(resolved, "resolved.yaml");
  EXPECT_EQ(back.str("data.path"),
            "a\rb\x01"
            "c");
  EXPECT_EQ(back.str("data.separator"), "\r\n");
  EXPECT_EQ(back.str("data.eos_token"), "caf\xc3\xa9");
  EXPECT_EQ(back.resolved_yaml(), resolved);
  // A carriage return yaml-cpp keeps in a plain value (config_fuzz).
  const Config cr = Config::parse("data:\n  path: dat\r\r\n\n", "c.yaml");
  EXPECT_EQ(cr.str("data.path"), "dat\r");
  EXPECT_EQ(Config::parse(cr.resolved_yaml(), "resolved.yaml").str("data.path"), "dat\r");
}

TEST(Config, WrongTypesNameTheLineAndKey) {
  const std::string e = error_of([] { Config::parse("train:\n  epochs: ten\n", "cfg.yaml"); });
  EXPECT_NE(e.find("cfg.yaml:2: train.epochs: expected an integer, got 'ten'"), std::string::npos)
      << e;
  EXPECT_NE(
      error_of([] { Config::parse("model: {dropout: [1]}\n", "c.yaml"); }).find("model.dropout"),
      std::string::npos);
  EXPECT_NE(error_of([] {
              Config::parse("", "c.yaml", {"model.bidirectional=maybe"});
            }).find("expected a boolean"),
            std::string::npos);
  EXPECT_NE(error_of([] { Config::parse("", "c.yaml", {"epochs"}); }).find("key.path=value"),
            std::string::npos);
  EXPECT_NE(error_of([] { Config::parse("a: [1\n", "c.yaml"); }).find("not valid YAML"),
            std::string::npos);
  EXPECT_NE(error_of([] { Config::load("/nonexistent/cfg.yaml"); }).find("/nonexistent/cfg.yaml"),
            std::string::npos);
}

// Every integer key has a range a model and a machine can hold: sizes that would overflow the
// products of sizes (parameters, windows, positions) or hang set-up are errors at parse time,
// naming the key, the range and where the value came from.
TEST(Config, IntegerKeysStayInTheirRange) {
  struct Case {
    std::string override_, want;
  };
  const std::vector<Case> cases = {
      {"adapter.rank=4611686018427387904", "adapter.rank must be in [1, 65536]"},
      {"model.hidden=4611686018427387904", "model.hidden must be in [1, 65536]"},
      {"data.stride=9223372036854775807", "data.stride must be in [1, 1000000]"},
      {"model.block_size=4611686018427387904", "model.block_size must be in [0, 1000000]"},
      {"model.layers=4611686018427387904", "model.layers must be in [1, 1024]"},
      {"data.prefetch_factor=4611686018427387904", "data.prefetch_factor must be in [1, 64]"},
      {"train.warmup_steps=-1", "train.warmup_steps must be in [0, 1000000000], got -1"},
      {"train.step_epochs=0", "train.step_epochs must be positive, got 0"},
      {"model.hidden=0", "model.hidden must be positive, got 0"},
  };
  for (const Case& c : cases) {
    const std::string e = error_of([&] { Config::parse("", "c.yaml", {c.override_}); });
    EXPECT_NE(e.find("override '" + c.override_ + "': " + c.want), std::string::npos) << e;
  }
  const std::string e =
      error_of([] { Config::parse("model:\n  layers: 99999999999\n", "cfg.yaml"); });
  EXPECT_NE(e.find("cfg.yaml:2: model.layers must be in [1, 1024], got 99999999999"),
            std::string::npos)
      << e;
  // The bounds themselves are accepted, and the seed takes any 64-bit value.
  EXPECT_EQ(Config::parse("", "c.yaml", {"model.hidden=65536"}).integer("model.hidden"), 65536);
  EXPECT_EQ(Config::parse("", "c.yaml", {"train.seed=-9223372036854775808"}).integer("train.seed"),
            INT64_MIN);
  for (const ConfigKey& k : config_keys()) {  // every integer key has its range
    if (k.type != ConfigKey::Type::integer) continue;
    EXPECT_EQ(error_of([&] { Config::parse("", "c.yaml", {k.path + "=" + k.default_value}); }), "")
        << k.path;
  }
}

// Nothing where a number or a switch is needed (null, an empty override) says so, and how to get
// the key's default instead.
TEST(Config, NothingForANumberSaysHowToUnsetIt) {
  EXPECT_EQ(error_of([] { Config::parse("", "c.yaml", {"model.embedding=null"}); }),
            "override 'model.embedding=null': model.embedding: expected an integer, got nothing "
            "(leave the key out for its default, 64)");
  EXPECT_EQ(error_of([] { Config::parse("optim:\n  lr:\n", "cfg.yaml"); }),
            "cfg.yaml:2: optim.lr: expected a number, got nothing (leave the key out for its "
            "default, 0.001)");
  EXPECT_EQ(
      error_of([] { Config::parse("", "c.yaml", {"train.test_after="}); }),
      "override 'train.test_after=': train.test_after: expected a boolean, got nothing (leave the "
      "key out for its default, true)");
  EXPECT_EQ(error_of([] { Config::parse("", "c.yaml", {"model.hidden=big"}); }),
            "override 'model.hidden=big': model.hidden: expected an integer, got 'big'");
}

// Keys that take one of a few words are checked as the config is read, before any data is: a
// typo is one line naming the key, the words and where the value came from; each word and each
// default is accepted.
TEST(Config, WordKeysTakeOneOfTheirWords) {
  EXPECT_EQ(error_of([] { Config::parse("", "c.yaml", {"optim.kind=adamax"}); }),
            "override 'optim.kind=adamax': optim.kind must be adamw, adam or sgd, got 'adamax'");
  EXPECT_EQ(error_of([] { Config::parse("train:\n  schedule: Cosine\n", "cfg.yaml"); }),
            "cfg.yaml:2: train.schedule must be constant, step, cosine or plateau, got 'Cosine'");
  EXPECT_EQ(error_of([] { Config::parse("model:\n  cell:\n", "cfg.yaml"); }),
            "cfg.yaml:2: model.cell must be lstm, gru or lnlstm, got ''");
  EXPECT_EQ(error_of([] { Config::parse("train:\n  precision: fp8\n", "cfg.yaml"); }),
            "cfg.yaml:2: train.precision must be auto, fp32, bf16 or fp16, got 'fp8'");
  EXPECT_EQ(
      error_of([] { Config::parse("", "c.yaml", {"optim.decay_params=matrix"}); }),
      "override 'optim.decay_params=matrix': optim.decay_params must be auto, all or matrices, "
      "got 'matrix'");
  EXPECT_NE(error_of([] {
              Config::parse("model: {family: [gpt]}\n", "c.yaml");
            }).find("model.family: expected a string, got a list"),
            std::string::npos);
  for (const auto& [key, words] : std::map<std::string, std::vector<std::string>>{
           {"model.family", {"recurrent", "transformer", "decoder"}},
           {"model.cell", {"lstm", "gru", "lnlstm"}},
           {"model.output", {"last", "every_step"}},
           {"adapter.kind", {"none", "lora", "dora"}},
           {"optim.kind", {"adamw", "adam", "sgd"}},
           {"optim.decay_params", {"all", "matrices"}},
           {"train.precision", {"auto", "fp32", "bf16", "fp16"}},
           {"train.loss", {"mse", "mae", "huber", "quantile"}},
           {"train.matmul_precision", {"highest", "high"}},
           {"train.device", {"auto", "cpu", "cuda"}},
           {"train.schedule", {"constant", "step", "cosine", "plateau"}},
           {"train.early_stopping.mode", {"auto", "min", "max"}},
           {"train.save", {"best", "last", "every_n"}}})
    for (const std::string& w : words)
      EXPECT_EQ(Config::parse("", "c.yaml", {key + "=" + w}).str(key),
                key == "train.early_stopping.mode" && w == "auto" ? "min" : w)
          << key;
}

// Anchors and aliases cannot make a small config stand for gigabytes (set-up re-emitted the
// expanded text for hours), nor can nesting run deep: both are refused at once, naming the source.
TEST(Config, ExpansionOfAliasesAndNestingIsBounded) {
  std::string yaml = "train:\n  run_dir: &big " + std::string(100000, 'x') + "\nmodel:\n  x: [";
  for (int i = 0; i < 100; ++i) yaml += std::string(i ? ", " : "") + "*big";
  yaml += "]\n";
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_of([&] { Config::parse(yaml, "big.yaml"); });
  EXPECT_NE(e.find("big.yaml: expands to more than 4 MB of YAML"), std::string::npos) << e;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  const std::string deep = "model:\n  x: " + std::string(100, '[') + std::string(100, ']') + "\n";
  EXPECT_NE(error_of([&] { Config::parse(deep, "deep.yaml"); }).find("nests deeper than 64"),
            std::string::npos);
  // Past yaml-cpp's own depth limit (its message: "bad file"), the same words, in the file or in
  // an override.
  const std::string deeper = std::string(2000, '[') + std::string(2000, ']');
  EXPECT_EQ(
      error_of([&] { Config::parse("model:\n  x: " + deeper + "\n", "deeper.yaml"); }),
      "deeper.yaml:2: not valid YAML: nests deeper than 64 levels; a config is far shallower");
  EXPECT_EQ(error_of([&] { Config::parse("", "c.yaml", {"model.hidden=" + deeper}); }),
            "override 'model.hidden=" + deeper.substr(0, 104) +
                "...': not valid YAML: nests deeper than 64 levels; a config is far shallower");
  EXPECT_NE(error_of([&] {
              Config::parse(
                  "", "c.yaml",
                  {"data.targets=[&a " + std::string(1 << 20, 'y') + ", *a, *a, *a, *a]"});
            }).find("override 'data.targets=[&a yyy"),
            std::string::npos);
}

TEST(Config, ReferenceDocMatchesTheKeyTable) {
  std::ifstream in(SEQFORGE_SOURCE_DIR "/docs/config.md");
  ASSERT_TRUE(in) << "docs/config.md missing";
  std::stringstream doc;
  doc << in.rdbuf();
  EXPECT_EQ(doc.str(), config_reference_markdown())
      << "docs/config.md is stale: run `seqforge config-reference > docs/config.md`";
}

}  // namespace
}  // namespace seqforge::config_test

namespace seqforge::config_test {
namespace {

TEST(Config, AutoDefaultsFollowTheKeysTheyDependOn) {
  // Weight decay as in PyTorch: 0.01 for adamw, 0 for adam and sgd; a given value is kept.
  EXPECT_EQ(Config::parse("", "c.yaml").number("optim.weight_decay"), 0.01);
  EXPECT_EQ(Config::parse("", "c.yaml").str("optim.decay_params"), "all");
  EXPECT_EQ(Config::parse("model: {family: transformer}\n", "c.yaml").str("optim.decay_params"),
            "matrices");
  EXPECT_EQ(Config::parse("model: {family: transformer}\noptim: {decay_params: all}\n", "c.yaml")
                .str("optim.decay_params"),
            "all");
  EXPECT_EQ(Config::parse("", "c.yaml", {"optim.kind=adam"}).number("optim.weight_decay"), 0.0);
  EXPECT_EQ(Config::parse("optim: {kind: sgd}\n", "c.yaml").number("optim.weight_decay"), 0.0);
  const Config given = Config::parse("optim: {kind: sgd, weight_decay: 0.5}\n", "c.yaml");
  EXPECT_EQ(given.number("optim.weight_decay"), 0.5);
  EXPECT_TRUE(given.is_set("optim.weight_decay"));
  EXPECT_FALSE(Config::parse("", "c.yaml").is_set("optim.weight_decay"));
  const Config auto_given = Config::parse("optim: {kind: adam, weight_decay: auto}\n", "c.yaml");
  EXPECT_EQ(auto_given.str("optim.weight_decay"), "0");
  EXPECT_TRUE(auto_given.is_set("optim.weight_decay"));
  EXPECT_EQ(Config::parse("", "c.yaml", {"optim.kind=sgd"}).number("optim.weight_decay"), 0.0);
  EXPECT_NE(Config::parse("", "c.yaml").resolved_yaml().find("  weight_decay: 0.01\n"),
            std::string::npos);
  // The monitor: val_loss, or train_loss without validation; the mode from the monitor.
  const Config plain = Config::parse("", "c.yaml");
  EXPECT_EQ(plain.str("train.early_stopping.monitor"), "val_loss");
  EXPECT_EQ(plain.str("train.early_stopping.mode"), "min");
  const Config no_val = Config::parse("data: {split: {val: 0}}\n", "c.yaml");
  EXPECT_EQ(no_val.str("train.early_stopping.monitor"), "train_loss");
  EXPECT_EQ(no_val.str("train.early_stopping.mode"), "min");
  for (const char* metric : {"val_accuracy", "val_f1"})
    EXPECT_EQ(Config::parse("", "c.yaml", {std::string("train.early_stopping.monitor=") + metric})
                  .str("train.early_stopping.mode"),
              "max")
        << metric;
  EXPECT_EQ(
      Config::parse("", "c.yaml",
                    {"train.early_stopping.monitor=val_accuracy", "train.early_stopping.mode=min"})
          .str("train.early_stopping.mode"),
      "min");
  EXPECT_NE(error_of([] {
              Config::parse("optim: {weight_decay: lots}\n", "c.yaml");
            }).find("c.yaml:1: optim.weight_decay: expected a number, got 'lots'"),
            std::string::npos);
  // The resolved dump holds the effective values.
  const Config again = Config::parse(no_val.resolved_yaml(), "resolved", {"optim.kind=adamw"});
  EXPECT_EQ(again.str("train.early_stopping.monitor"), "train_loss");
  EXPECT_EQ(again.str("train.early_stopping.mode"), "min");
  EXPECT_EQ(again.number("optim.weight_decay"), 0.01);
  // Auto resolution sees overrides: the monitor follows an overridden split.
  EXPECT_EQ(Config::parse("", "c.yaml", {"data.split.val=0"}).str("train.early_stopping.monitor"),
            "train_loss");
  EXPECT_EQ(Config::parse("", "c.yaml", {"train.early_stopping.monitor=val_loss"})
                .str("train.early_stopping.mode"),
            "min");
}

TEST(Config, TransformIsAMapOfColumnToName) {
  const Config c =
      Config::parse("data:\n  transform: {close: log_return, volume: log}\n", "c.yaml");
  EXPECT_EQ(c.map("data.transform"),
            (std::map<std::string, std::string>{{"close", "log_return"}, {"volume", "log"}}));
  EXPECT_TRUE(Config::parse("", "c.yaml").map("data.transform").empty());
  const Config o = Config::parse("", "c.yaml", {"data.transform={price: diff}"});
  EXPECT_EQ(o.map("data.transform"), (std::map<std::string, std::string>{{"price", "diff"}}));
  const Config again = Config::parse(c.resolved_yaml(), "resolved");
  EXPECT_EQ(again.map("data.transform"), c.map("data.transform"));
  const std::string e = error_of([] { Config::parse("data:\n  transform: [log]\n", "c.yaml"); });
  EXPECT_NE(e.find("c.yaml:2: data.transform: expected a map of column to transform, got a list"),
            std::string::npos)
      << e;
  EXPECT_NE(error_of([] { Config::parse("", "c.yaml", {"data.transform=log"}); })
                .find("override 'data.transform=log': data.transform: expected a map of column to "
                      "transform, got 'log'"),
            std::string::npos);
  EXPECT_TRUE(Config::parse("data:\n  transform:\n", "c.yaml").map("data.transform").empty());
  EXPECT_TRUE(Config::parse("", "c.yaml", {"data.transform="}).map("data.transform").empty());
  EXPECT_NE(c.resolved_yaml().find("  transform: {close: log_return, volume: log}\n"),
            std::string::npos)
      << c.resolved_yaml();
  EXPECT_NE(error_of([] {
              Config::parse("data:\n  transform: {a: [log]}\n", "c.yaml");
            }).find("data.transform"),
            std::string::npos);
  EXPECT_EQ(Config::parse("", "c.yaml").str("data.split.by"), "rows");
  EXPECT_EQ(Config::parse("", "c.yaml", {"data.split.by=date"}).str("data.split.by"), "date");
  EXPECT_EQ(Config::parse("", "c.yaml").str("data.series_column"), "");
}

TEST(Config, StringsRoundTripThroughTheResolvedDump) {
  // Values YAML would misread unquoted, and empty values written as nothing.
  const Config c = Config::parse(
      "data:\n  path: 'a: b #c.csv'\n  date_column:\n  series_column: '[x]'\n"
      "  class_column: 'null'\n  features: ['p, q', r]\n  targets:\n",
      "c.yaml");
  EXPECT_EQ(c.str("data.path"), "a: b #c.csv");
  EXPECT_EQ(c.str("data.date_column"), "");
  EXPECT_EQ(c.str("data.series_column"), "[x]");
  EXPECT_EQ(c.str("data.class_column"), "null");
  EXPECT_EQ(c.list("data.features"), (std::vector<std::string>{"p, q", "r"}));
  EXPECT_TRUE(c.list("data.targets").empty());
  const Config again = Config::parse(c.resolved_yaml(), "resolved");
  for (const auto& k : config_keys()) EXPECT_EQ(again.str(k.path), c.str(k.path)) << k.path;
  EXPECT_EQ(again.list("data.features"), c.list("data.features"));
}

TEST(Config, AbsolutePathsKeepThePathAsWritten) {
  const Config c =
      Config::parse("data: {path: data/x.csv}\nmodel: {init_from: /abs/w.safetensors}\n", "c.yaml");
  const Config a = c.with_absolute_paths("/work/here");
  EXPECT_EQ(a.str("data.path"), "/work/here/data/x.csv");
  EXPECT_EQ(a.str("model.init_from"), "/abs/w.safetensors");  // already absolute
  EXPECT_EQ(a.str("train.run_dir"), "");                      // empty stays empty
  EXPECT_EQ(Config::parse("data: {path: ../y.csv}\n", "c.yaml")
                .with_absolute_paths("/work/here")
                .str("data.path"),
            "/work/y.csv");
  const std::string yaml = a.resolved_yaml();
  EXPECT_NE(yaml.find("path: /work/here/data/x.csv  # as written: data/x.csv"), std::string::npos)
      << yaml;
  EXPECT_EQ(yaml.find("# as written: /abs"), std::string::npos) << yaml;
  const Config again = Config::parse(yaml, "resolved");
  for (const auto& k : config_keys()) EXPECT_EQ(again.str(k.path), a.str(k.path)) << k.path;
  EXPECT_EQ(again.with_absolute_paths("/elsewhere").resolved_yaml().find("as written"),
            std::string::npos);
}

}  // namespace
}  // namespace seqforge::config_test
