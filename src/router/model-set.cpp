// See model-set.h.
#include "router/model-set.h"

#include <fnmatch.h>

#include <algorithm>
#include <stdexcept>
#include <system_error>

namespace keepwarm::router {

namespace {
namespace fs = std::filesystem;

// llama-server's router takes a file of a model's folder named mtp-*, dspark-* or dflash-* as that model's draft
// sidecar (common/preset.cpp), never as a model. keepwarm has none of those drafters yet: not a model either.
bool is_draft_sidecar(const fs::path& p) {
    const std::string name = p.filename().string();
    return p.extension() == ".gguf" &&
           (name.starts_with("mtp-") || name.starts_with("dspark-") || name.starts_with("dflash-"));
}

bool is_gguf(const fs::path& p) {
    return p.extension() == ".gguf" && !p.filename().string().starts_with("mmproj") && !is_draft_sidecar(p);
}

// The model file of a folder: its one GGUF, or the first shard of a split model; nullopt (with why) if neither.
std::optional<fs::path> folder_model(const fs::path& dir, std::string& why) {
    std::vector<fs::path> ggufs;
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
        if (e.is_regular_file(ec) && is_gguf(e.path())) ggufs.push_back(e.path());
    }
    if (ec) {
        why = "cannot be read (" + ec.message() + ")";
        return std::nullopt;
    }
    if (ggufs.size() == 1) return ggufs.front();
    std::sort(ggufs.begin(), ggufs.end());
    for (const fs::path& p : ggufs) {
        if (p.stem().string().find("-00001-of-") != std::string::npos) return p;
    }
    why = ggufs.empty() ? "holds no .gguf file" : "holds several .gguf files and no first shard (-00001-of-)";
    return std::nullopt;
}

std::string normalized_key(std::string_view key) {
    std::string name(key);
    std::replace(name.begin(), name.end(), '_', '-');
    return name;
}

}  // namespace

std::vector<model_entry> scan_models_dir(const fs::path& dir, std::vector<std::string>* skipped) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) throw std::runtime_error("--models-dir '" + dir.string() + "' is not a folder");
    std::vector<model_entry> found;
    fs::directory_iterator it(dir, ec);
    if (ec) throw std::runtime_error("--models-dir '" + dir.string() + "' cannot be read: " + ec.message());
    for (const fs::directory_entry& e : it) {
        const fs::path& p = e.path();
        if (p.filename().string().starts_with(".")) continue;
        model_entry m;
        m.source = dir.string() + "/";
        if (e.is_directory(ec)) {
            std::string why;
            const std::optional<fs::path> file = folder_model(p, why);
            if (!file) {
                if (skipped) skipped->push_back(p.string() + ": " + why);
                continue;
            }
            std::error_code sidecar_ec;
            for (const fs::directory_entry& f : fs::directory_iterator(p, sidecar_ec)) {
                if (skipped && is_draft_sidecar(f.path())) {
                    skipped->push_back(f.path().string() +
                                       ": an MTP/DSpark/DFlash draft sidecar, which keepwarm cannot draft with yet ("
                                       "its model is served without it; a draft model is given with spec-draft-model)");
                }
            }
            m.name = p.filename().string();
            m.path = fs::absolute(*file).lexically_normal().string();
        } else if (e.is_regular_file(ec) && is_gguf(p)) {
            m.name = p.stem().string();
            m.path = fs::absolute(p).lexically_normal().string();
        } else {
            continue;  // not a model: a README, a download in progress, a projector
        }
        found.push_back(std::move(m));
    }
    std::sort(found.begin(), found.end(), [](const model_entry& a, const model_entry& b) { return a.name < b.name; });
    return found;
}

std::vector<model_entry> read_models_table(const toml::table& models, const config::toml_reader& reader,
                                           const fs::path& base_dir,
                                           const std::function<option_arity(const std::string&)>& arity_of,
                                           const std::vector<std::string>& router_options,
                                           const std::vector<std::string>& path_options) {
    const auto in_list = [](const std::vector<std::string>& list, const std::string& name) {
        return std::find(list.begin(), list.end(), name) != list.end();
    };
    const auto from_base = [&base_dir](const std::string& value) {
        return value.empty() || fs::path(value).is_absolute() ? value : (base_dir / value).lexically_normal().string();
    };
    std::vector<model_entry> entries;
    for (auto&& [name_key, node] : models) {
        const std::string name(name_key.str());
        const std::string where = "[models." + name + "]";
        const toml::table& t = reader.table(node, "models." + name);
        model_entry m;
        m.name = name;
        m.source = reader.source() + ":" + std::to_string(name_key.source().begin.line);
        if (name.empty()) reader.fail(name_key.source(), "a model's name may not be empty");
        for (auto&& [key, value] : t) {
            const std::string k = normalized_key(key.str());
            const std::string what = "models." + name + "." + k;
            if (k == "path") {
                m.path = from_base(reader.string(value, what));
                if (m.path.empty()) reader.fail(value.source(), "'" + what + "' may not be empty");
            } else if (k == "aliases") {
                if (const toml::array* list = value.as_array()) {
                    for (const toml::node& item : *list) m.aliases.push_back(reader.string(item, what));
                } else {
                    m.aliases.push_back(reader.string(value, what));
                }
            } else if (k == "load") {
                m.load_at_start = reader.boolean(value, what);
            } else if (k == "pinned") {
                m.pinned = reader.boolean(value, what);
            } else if (in_list(router_options, k)) {
                reader.fail(key.source(), "'" + k + "' in " + where + " is set by the router for each model");
            } else {
                const option_arity arity = arity_of(k);
                if (arity == option_arity::unknown) {
                    reader.fail(key.source(), "unknown key '" + std::string(key.str()) + "' in " + where +
                                                  " (known: path, aliases, load, pinned, and the long options of "
                                                  "`keepwarm serve --help` without their dashes)");
                }
                std::vector<std::string> values;
                if (arity == option_arity::flag) {
                    if (!reader.boolean(value, what)) continue;  // false: the option's default, nothing to pass
                } else if (const toml::array* list = value.as_array()) {
                    if (arity != option_arity::values) reader.wrong_type(value, what, "a single value");
                    for (const toml::node& item : *list) values.push_back(reader.option_text(item, what));
                } else {
                    values.push_back(reader.option_text(value, what));
                }
                if (in_list(path_options, k)) {
                    for (std::string& v : values) v = from_base(v);
                }
                m.options.emplace_back(k, std::move(values));
            }
        }
        if (m.path.empty()) reader.fail(name_key.source(), where + " has no 'path' (the model's GGUF file)");
        entries.push_back(std::move(m));
    }
    return entries;
}

model_set::model_set(std::vector<model_entry> from_dir, std::vector<model_entry> from_tables) {
    for (model_entry& t : from_tables) {
        std::erase_if(from_dir, [&t](const model_entry& d) { return d.name == t.name; });
    }
    entries_ = std::move(from_dir);
    for (model_entry& t : from_tables) entries_.push_back(std::move(t));
    for (size_t i = 0; i < entries_.size(); ++i) {
        const model_entry& m = entries_[i];
        if (m.name.empty() || m.name == "." || m.name == ".." || m.name.find('/') != std::string::npos) {
            // The name is a folder of the cache directory too.
            throw std::invalid_argument("a model of " + m.source + " is named '" + m.name +
                                        "': a model's name is a non-empty folder name");
        }
        std::vector<std::string> names = m.aliases;
        names.insert(names.begin(), m.name);
        for (const std::string& n : names) {
            if (n.empty() || n.find(',') != std::string::npos) {
                throw std::invalid_argument("model '" + m.name + "' (" + m.source + "): a name or alias '" + n +
                                            "' is empty or holds a comma");
            }
            if (n != m.name && n.find_first_of("*?[") != std::string::npos) patterns_.emplace_back(n, i);
            const auto [it, inserted] = by_name_.emplace(n, i);
            if (!inserted && it->second != i) {
                const model_entry& other = entries_[it->second];
                throw std::invalid_argument("the name '" + n + "' is taken by two models: '" + other.name + "' (" +
                                            other.source + ") and '" + m.name + "' (" + m.source + ")");
            }
        }
    }
}

std::optional<size_t> model_set::find(const std::string& name) const {
    if (const auto it = by_name_.find(name); it != by_name_.end()) return it->second;
    for (const auto& [pattern, index] : patterns_) {
        if (fnmatch(pattern.c_str(), name.c_str(), 0) == 0) return index;
    }
    return std::nullopt;
}

std::string model_set::names() const {
    std::string list;
    for (const model_entry& m : entries_) list += (list.empty() ? "" : ", ") + m.name;
    return list;
}

}  // namespace keepwarm::router
