// The training config: parsing, overrides, types, unknown keys, the resolved dump, and the
// reference docs/config.md, which must match the key table.
#include "seqforge/train/config.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "seqforge/core/error.hpp"
#include "test_util.hpp"

namespace seqforge {
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

TEST(Config, UnknownKeysSuggestTheClosest) {
  const std::string e = error_of([] { Config::parse("model:\n  hiden: 3\n", "cfg.yaml"); });
  EXPECT_NE(e.find("cfg.yaml:2"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key 'model.hiden'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'model.hidden'"), std::string::npos) << e;
  const std::string o = error_of([] { Config::parse("", "cfg.yaml", {"train.epoch=3"}); });
  EXPECT_NE(o.find("did you mean 'train.epochs'"), std::string::npos) << o;
  EXPECT_NE(error_of([] { Config::parse("nonsense: 1\n", "cfg.yaml"); }).find("unknown key"),
            std::string::npos);
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

TEST(Config, ReferenceDocMatchesTheKeyTable) {
  std::ifstream in(SEQFORGE_SOURCE_DIR "/docs/config.md");
  ASSERT_TRUE(in) << "docs/config.md missing";
  std::stringstream doc;
  doc << in.rdbuf();
  EXPECT_EQ(doc.str(), config_reference_markdown())
      << "docs/config.md is stale: run `seqforge config-reference > docs/config.md`";
}

}  // namespace
}  // namespace seqforge
