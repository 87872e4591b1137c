#pragma once
// What a YAML config may expand to. Anchors and aliases repeat their text, so a small file can
// stand for gigabytes (a 1 MB string referenced 20,000 times) that every later step would copy:
// beyond 4 MB expanded, or 64 levels deep, a config is refused before anything reads it.
#include <yaml-cpp/yaml.h>

#include <string>

namespace seqforge {

// Throws an error naming `source` when `root` expands to more than the bound.
void check_yaml_expansion(const YAML::Node& root, const std::string& source);

// What yaml-cpp's exception says, in words a user acts on ("bad file" is its message for nesting
// past its own depth limit).
std::string yaml_error(const YAML::Exception& e);

// A map key as text; a key that is a list or a map ({[a, b]: 1}) is refused, naming `where`.
std::string yaml_key(const YAML::Node& key, const std::string& where);

}  // namespace seqforge
