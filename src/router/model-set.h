// The models a router serves (`keepwarm serve --models-dir DIR`, a settings file's [models.NAME] tables): each one's
// name, file, aliases and the serve options its own server gets, and the lookup of a request's model name (a name or
// an alias) to its entry. Built once at start-up; read-only after.
// Threading: a built model_set is read from any thread.
#pragma once

#include <toml++/toml.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config/toml-reader.h"

namespace keepwarm::router {

struct model_entry {
    std::string name;  // what requests name it by ("model"), the file's stem or folder's name, or its table's name
    std::string path;  // the GGUF file
    std::vector<std::string> aliases;
    // Serve options for this model's server only, as long option names without dashes and the values the command
    // line would take: ("ctx-size", {"4096"}); a flag set true has no value, one set false is not listed.
    std::vector<std::pair<std::string, std::vector<std::string>>> options;
    bool load_at_start = false;  // its table's `load = true`: started with the router
    bool pinned = false;         // its table's `pinned = true`: never unloaded to make room, nor for being idle
    std::string source;          // where it was found ("DIR/" or "FILE:LINE"), for messages
    // The memory its server takes at most, computed at start-up (weights + KV cache of its context and slots + its
    // RAM tier); what --models-memory counts. 0: not known (then it counts nothing).
    uint64_t footprint_bytes = 0;
};

// How a [models.NAME] key that is a serve option takes its value, as the command line would (see options-file.h).
enum class option_arity { unknown, flag, value, values };

// Every model of `dir`, sorted by name: each `*.gguf` file (named by its stem), and each folder holding one model
// (named by the folder): its one .gguf, or the first shard of a split model (NAME-00001-of-000NN.gguf); files whose
// names start with "mmproj" (a multimodal projector) are not models. Anything else is skipped, with a reason in
// `skipped`. Throws std::runtime_error if `dir` is not a readable folder.
std::vector<model_entry> scan_models_dir(const std::filesystem::path& dir, std::vector<std::string>* skipped = nullptr);

// The [models] table of a settings file: [models.NAME] tables of `path` (required; relative to `base_dir`),
// `aliases` (a string or a list), `load`, `pinned`, and serve options (`ctx-size = 4096`) that `arity_of` knows.
// Every mistake fails through `reader`, naming the file and line: an unknown key, a missing path, a wrong type, an
// option the router sets itself (`router_options`: host, port, model, ...). Relative values of `path_options` are taken
// from `base_dir` too.
std::vector<model_entry> read_models_table(const toml::table& models, const config::toml_reader& reader,
                                           const std::filesystem::path& base_dir,
                                           const std::function<option_arity(const std::string&)>& arity_of,
                                           const std::vector<std::string>& router_options,
                                           const std::vector<std::string>& path_options);

class model_set {
public:
    model_set() = default;
    // The models of a folder and of a settings file: a table's model replaces the folder's model of the same name.
    // Throws std::invalid_argument when two models share a name or an alias, or a name is empty.
    model_set(std::vector<model_entry> from_dir, std::vector<model_entry> from_tables);

    size_t size() const { return entries_.size(); }
    const model_entry& operator[](size_t i) const { return entries_[i]; }
    const std::vector<model_entry>& entries() const { return entries_; }
    // The model that `name` names (its name or one of its aliases, an alias with `*` or `?` as a shell pattern:
    // "claude-haiku-*"), or nullopt. An exact name or alias wins over a pattern; patterns in the set's order.
    std::optional<size_t> find(const std::string& name) const;
    // "a, b, c": the names, for messages.
    std::string names() const;
    // The model that serves a request naming none of the set's names (an agent's "claude-haiku-..." background calls),
    // as a single model's server serves every name: the policy's `[model] mode = "any"` (the default), with
    // --models-default or else the first model. nullopt (mode "strict"): such a name is a 404.
    std::optional<size_t> default_model() const { return default_model_; }
    void set_default_model(std::optional<size_t> model) { default_model_ = model; }

private:
    std::vector<model_entry> entries_;
    std::map<std::string, size_t> by_name_;                 // names and aliases
    std::vector<std::pair<std::string, size_t>> patterns_;  // aliases with * or ?, in the set's order
    std::optional<size_t> default_model_;
};

}  // namespace keepwarm::router
