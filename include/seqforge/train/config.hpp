#pragma once
// The training configuration: a YAML file plus `key.path=value` overrides, checked against one
// table of keys (type, default, meaning). That table also renders docs/config.md, so the
// reference cannot drift from the code.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace seqforge {

struct ConfigKey {
  enum class Type { string, integer, number, boolean, string_list, string_map, path };
  std::string path;  // "model.hidden"
  Type type;
  std::string default_value;  // as YAML text; "" for none
  std::string doc;
};

const std::vector<ConfigKey>& config_keys();
// " (did you mean 'model.hidden'?)" for a key that is none, or "".
std::string config_key_suggestion(const std::string& path);
// A number or truth value of key `path` in its one spelling ("0.70" as "0.7", "on" as "true"), as
// configs hold them; other text as it is.
std::string canonical_value(const std::string& path, const std::string& text);
// Of `words`, the one a few edits from `word` (a typo of it); "" if none.
std::string closest_word(const std::string& word, const std::vector<std::string>& words);
std::string config_reference_markdown();  // the text of docs/config.md
// Whether a larger value of metric `name` is the better one (accuracy, F1, forecast skill), for
// early stopping's mode auto and a study's direction.
bool higher_is_better(const std::string& name);
// `text` as a YAML string scalar (double-quoted), for an override's value: a path holding " #",
// ": " or brackets reads back as itself.
std::string yaml_string(const std::string& text);

class Config {
 public:
  // Reads `path` and applies overrides ("train.epochs=5"). Errors name the file and line or the
  // override, and the key: unknown keys get a did-you-mean suggestion.
  static Config load(const std::string& path, const std::vector<std::string>& overrides = {});
  // The same from YAML text; `source` names it in errors.
  static Config parse(const std::string& yaml, const std::string& source,
                      const std::vector<std::string>& overrides = {});

  std::string str(const std::string& key) const;
  int64_t integer(const std::string& key) const;
  double number(const std::string& key) const;
  bool boolean(const std::string& key) const;
  std::vector<std::string> list(const std::string& key) const;
  std::map<std::string, std::string> map(const std::string& key) const;
  // Given in the file or an override (`auto` included); false for a default, also one resolved
  // from `auto`.
  bool is_set(const std::string& key) const;
  // Set to a value other than its default (a resumed run's resolved config sets every key).
  bool differs_from_default(const std::string& key) const;
  const std::string& source() const { return source_; }
  // Where a key's value came from, for errors about it: "file:line", "override 'key=value'", or
  // the config's source for a default.
  const std::string& origin(const std::string& key) const;
  // Every key with its value, defaults filled in, as YAML; a path made absolute has the path as
  // written in a comment beside it.
  std::string resolved_yaml() const;
  // This config with every relative path (data.path, model.init_from, augment.cache_dir,
  // train.run_dir) made absolute against `base_dir`.
  Config with_absolute_paths(const std::string& base_dir) const;
  // This config with `values` (key -> YAML text) set as if given (is_set), `where` their source.
  Config with_values(const std::map<std::string, std::string>& values,
                     const std::string& where) const;

 private:
  const ConfigKey& key_of(const std::string& key) const;
  // Keys whose default `auto` depends on other keys: optim.weight_decay (by optim.kind),
  // train.early_stopping.monitor (by data.split.val) and .mode (by the monitor).
  void resolve_auto();
  std::string source_;
  std::map<std::string, std::string> values_;   // key -> value as YAML text (flow lists, maps)
  std::map<std::string, std::string> where_;    // key -> "file:line" or "override"
  std::map<std::string, std::string> written_;  // path key -> the relative path as written
};

}  // namespace seqforge
