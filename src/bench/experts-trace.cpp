// See experts-trace.h. The binary form: an 8-byte magic, the header fields, two length-prefixed strings, then per
// layer its index, its expert bytes and tokens x experts-used 16-bit ids; every length is checked against the bytes
// left in the file before anything is allocated or read.
#include "bench/experts-trace.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <istream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace keepwarm::bench {

namespace {

constexpr char k_binary_magic[8] = {'K', 'W', 'E', 'X', 'P', 'T', 'R', '1'};

bool ends_with(const std::string& text, const std::string& suffix) {
    return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Binary trace I/O: native little-endian fields, the same on every platform keepwarm builds for.
template <typename T>
void put(std::ostream& out, T value) {
    out.write(reinterpret_cast<const char*>(&value), sizeof(value));
}

void put_string(std::ostream& out, const std::string& text) {
    put<uint32_t>(out, uint32_t(text.size()));
    out.write(text.data(), std::streamsize(text.size()));
}

class binary_reader {
public:
    binary_reader(std::istream& in, uint64_t size) : in_(in), left_(size) {}

    template <typename T>
    T get() {
        T value;
        take(&value, sizeof(value));
        return value;
    }

    std::string get_string() {
        const uint32_t size = get<uint32_t>();
        if (size > left_) throw std::runtime_error("truncated");
        std::string text(size, '\0');
        take(text.data(), text.size());
        return text;
    }

    void take(void* data, uint64_t size) {
        if (size > left_) throw std::runtime_error("truncated");
        in_.read(static_cast<char*>(data), std::streamsize(size));
        if (!in_) throw std::runtime_error("truncated");
        left_ -= size;
    }

    uint64_t left() const { return left_; }

private:
    std::istream& in_;
    uint64_t left_;
};

void write_binary_trace(const expert_trace& trace, std::ostream& out) {
    out.write(k_binary_magic, sizeof(k_binary_magic));
    put<uint32_t>(out, trace.n_expert);
    put<uint32_t>(out, trace.n_expert_used);
    put<uint64_t>(out, trace.n_prompt_tokens);
    put<uint64_t>(out, trace.n_generated_tokens);
    put_string(out, trace.model_path);
    put_string(out, trace.model_desc);
    put<uint32_t>(out, uint32_t(trace.layers.size()));
    for (const auto& layer : trace.layers) {
        put<int32_t>(out, layer.layer);
        put<uint64_t>(out, layer.expert_bytes);
        std::vector<uint16_t> ids(layer.ids.begin(), layer.ids.end());
        out.write(reinterpret_cast<const char*>(ids.data()), std::streamsize(ids.size() * sizeof(uint16_t)));
    }
}

expert_trace read_binary_trace(std::istream& in, uint64_t size) {
    binary_reader r(in, size);
    char magic[sizeof(k_binary_magic)];
    r.take(magic, sizeof(magic));
    expert_trace trace;
    trace.n_expert = r.get<uint32_t>();
    trace.n_expert_used = r.get<uint32_t>();
    trace.n_prompt_tokens = r.get<uint64_t>();
    trace.n_generated_tokens = r.get<uint64_t>();
    trace.model_path = r.get_string();
    trace.model_desc = r.get_string();
    const uint32_t n_layers = r.get<uint32_t>();
    // Bounded by the file size before multiplying, so a corrupt header can't overflow or allocate wildly.
    if (trace.n_prompt_tokens > r.left() || trace.n_generated_tokens > r.left() ||
        trace.n_expert_used > trace.n_expert) {
        throw std::runtime_error("inconsistent header");
    }
    const uint64_t per_layer_ids = trace.n_tokens() * trace.n_expert_used;
    for (uint32_t i = 0; i < n_layers; ++i) {
        expert_layer_trace layer;
        layer.layer = r.get<int32_t>();
        layer.expert_bytes = r.get<uint64_t>();
        if (per_layer_ids > r.left() / sizeof(uint16_t)) throw std::runtime_error("truncated");
        std::vector<uint16_t> ids(per_layer_ids);
        r.take(ids.data(), ids.size() * sizeof(uint16_t));
        layer.ids.assign(ids.begin(), ids.end());
        trace.layers.push_back(std::move(layer));
    }
    if (r.left() != 0) throw std::runtime_error("unexpected bytes after the last layer");
    return trace;
}

std::string json_trace(const expert_trace& trace) {
    nlohmann::ordered_json j;
    j["format"] = "keepwarm-expert-trace";
    j["version"] = 1;
    j["model"] = {{"path", trace.model_path}, {"desc", trace.model_desc}};
    j["n_expert"] = trace.n_expert;
    j["n_expert_used"] = trace.n_expert_used;
    j["prompt_tokens"] = trace.n_prompt_tokens;
    j["generated_tokens"] = trace.n_generated_tokens;
    j["layers"] = nlohmann::ordered_json::array();
    for (const auto& layer : trace.layers) {
        j["layers"].push_back({{"layer", layer.layer}, {"expert_bytes", layer.expert_bytes}, {"ids", layer.ids}});
    }
    return j.dump();
}

// The JSON value as a T if it is a whole number T can hold; nlohmann's get<T>() would truncate 2.5, wrap -1 and
// convert 1e30 with undefined behaviour.
template <typename T>
std::optional<T> whole_number(const nlohmann::json& value) {
    if (value.is_number_unsigned()) {
        const uint64_t number = value.get<uint64_t>();
        if (std::in_range<T>(number)) return T(number);
    } else if (value.is_number_integer()) {
        const int64_t number = value.get<int64_t>();
        if (std::in_range<T>(number)) return T(number);
    }
    return std::nullopt;
}

template <typename T>
T whole_field(const nlohmann::json& object, const std::string& key) {
    if (const std::optional<T> number = whole_number<T>(object.at(key))) return *number;
    throw std::runtime_error("'" + key + "' must be a whole number from " +
                             std::to_string(std::numeric_limits<T>::min()) + " to " +
                             std::to_string(std::numeric_limits<T>::max()));
}

expert_trace parse_json_trace(const std::string& text) {
    const auto j = nlohmann::json::parse(text);
    if (j.value("format", "") != "keepwarm-expert-trace") throw std::runtime_error("not a keepwarm expert trace");
    expert_trace trace;
    trace.model_path = j.at("model").value("path", "");
    trace.model_desc = j.at("model").value("desc", "");
    trace.n_expert = whole_field<uint32_t>(j, "n_expert");
    trace.n_expert_used = whole_field<uint32_t>(j, "n_expert_used");
    trace.n_prompt_tokens = whole_field<uint64_t>(j, "prompt_tokens");
    trace.n_generated_tokens = whole_field<uint64_t>(j, "generated_tokens");
    if (!j.at("layers").is_array()) throw std::runtime_error("'layers' must be an array");
    for (const auto& layer : j.at("layers")) {
        expert_layer_trace& read = trace.layers.emplace_back();
        read.layer = whole_field<int>(layer, "layer");
        read.expert_bytes = whole_field<uint64_t>(layer, "expert_bytes");
        const std::string where = "layer " + std::to_string(read.layer);
        if (!layer.at("ids").is_array()) throw std::runtime_error(where + ": 'ids' must be an array");
        read.ids.reserve(layer.at("ids").size());
        for (const auto& id : layer.at("ids")) {
            const std::optional<int32_t> number = whole_number<int32_t>(id);
            if (!number) throw std::runtime_error(where + ": an expert id is not a whole number");
            read.ids.push_back(*number);
        }
    }
    return trace;
}

}  // namespace

void validate_expert_trace(const expert_trace& trace) {
    if (trace.n_expert == 0 || trace.n_expert > std::numeric_limits<uint16_t>::max()) {
        throw std::invalid_argument("expert count " + std::to_string(trace.n_expert) + " is outside 1..65535");
    }
    if (trace.n_expert_used == 0 || trace.n_expert_used > trace.n_expert) {
        throw std::invalid_argument("experts used per token (" + std::to_string(trace.n_expert_used) +
                                    ") must be between 1 and the expert count (" + std::to_string(trace.n_expert) +
                                    ")");
    }
    if (trace.layers.empty()) throw std::invalid_argument("the trace has no MoE layers");
    // Checked first so that the id count each layer needs is a number, not one wrapped around.
    if (trace.n_prompt_tokens > std::numeric_limits<uint64_t>::max() - trace.n_generated_tokens ||
        trace.n_tokens() > std::numeric_limits<uint64_t>::max() / trace.n_expert_used) {
        throw std::invalid_argument(std::to_string(trace.n_prompt_tokens) + " + " +
                                    std::to_string(trace.n_generated_tokens) +
                                    " tokens are more than a trace can hold");
    }
    const uint64_t expected = trace.n_tokens() * trace.n_expert_used;
    std::vector<uint64_t> seen_in_token(trace.n_expert, std::numeric_limits<uint64_t>::max());
    for (const auto& layer : trace.layers) {
        const std::string where = "layer " + std::to_string(layer.layer);
        if (layer.ids.size() != expected) {
            throw std::invalid_argument(where + " has " + std::to_string(layer.ids.size()) + " expert ids, expected " +
                                        std::to_string(trace.n_tokens()) + " tokens x " +
                                        std::to_string(trace.n_expert_used) + " = " + std::to_string(expected));
        }
        std::fill(seen_in_token.begin(), seen_in_token.end(), std::numeric_limits<uint64_t>::max());
        for (uint64_t i = 0; i < layer.ids.size(); ++i) {
            const int32_t id = layer.ids[i];
            const uint64_t token = i / trace.n_expert_used;
            if (id < 0 || uint32_t(id) >= trace.n_expert) {
                throw std::invalid_argument(where + ", token " + std::to_string(token) + ": expert id " +
                                            std::to_string(id) + " is outside 0.." +
                                            std::to_string(trace.n_expert - 1));
            }
            if (seen_in_token[id] == token) {
                throw std::invalid_argument(where + ", token " + std::to_string(token) + ": expert " +
                                            std::to_string(id) + " is chosen twice");
            }
            seen_in_token[id] = token;
        }
    }
}

void write_expert_trace(const expert_trace& trace, const std::string& path) {
    validate_expert_trace(trace);  // the binary form keeps 16-bit ids
    std::ofstream out(path, std::ios::binary);
    if (ends_with(path, ".json")) {
        out << json_trace(trace) << "\n";
    } else {
        write_binary_trace(trace, out);
    }
    if (!out) throw std::runtime_error("cannot write '" + path + "'");
}

expert_trace read_expert_trace(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open trace '" + path + "'");
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(path, ec);
    char magic[sizeof(k_binary_magic)] = {};
    in.read(magic, sizeof(magic));
    in.clear();
    in.seekg(0);
    expert_trace trace;
    try {
        if (!ec && std::memcmp(magic, k_binary_magic, sizeof(magic)) == 0) {
            trace = read_binary_trace(in, size);
        } else {
            std::ostringstream text;
            text << in.rdbuf();
            trace = parse_json_trace(text.str());
        }
        validate_expert_trace(trace);
    } catch (const std::exception& e) {
        throw std::runtime_error("bad trace file '" + path + "': " + e.what());
    }
    return trace;
}

}  // namespace keepwarm::bench
