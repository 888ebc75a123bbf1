// See bounded-json.h.
#include "json/bounded-json.h"

#include <simdjson.h>

#include "base/request-error.h"

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace keepwarm::bounded_json {

namespace {

// Builds the tree from nlohmann's SAX events. nlohmann's own builder inserts each key through ordered_map's
// operator[], a linear search of the keys before it; this one appends to the object's vector and finds duplicates
// in a hash index per open object, built only once an object outgrows a short linear scan.
class tree_builder {
public:
    explicit tree_builder(int depth_limit) : depth_limit_(depth_limit) {}

    json root;
    bool too_deep = false;
    std::string error;

    bool null() { return place(json(nullptr)); }
    bool boolean(bool v) { return place(json(v)); }
    bool number_integer(json::number_integer_t v) { return place(json(v)); }
    bool number_unsigned(json::number_unsigned_t v) { return place(json(v)); }
    bool number_float(json::number_float_t v, const json::string_t&) { return place(json(v)); }
    bool string(json::string_t& v) { return place(json(std::move(v))); }
    bool binary(json::binary_t&) { return false; }  // only binary formats (CBOR, ...) have these, never JSON text

    bool start_object(std::size_t) { return open(json::object()); }
    bool start_array(std::size_t) { return open(json::array()); }
    bool end_object() { return close(); }
    bool end_array() { return close(); }

    bool key(json::string_t& k) {
        frame& f = open_.back();
        auto& entries = f.container->get_ref<json::object_t&>();
        using entry_list = json::object_t::Container;
        auto& list = static_cast<entry_list&>(entries);
        if (f.index.empty() && list.size() < linear_scan_keys) {
            for (auto& entry : list) {
                if (entry.first == k) {
                    value_slot_ = &entry.second;
                    return true;
                }
            }
        } else {
            if (f.index.empty()) {
                for (size_t i = 0; i < list.size(); ++i) f.index.emplace(list[i].first, i);
            }
            if (const auto it = f.index.find(k); it != f.index.end()) {
                value_slot_ = &list[it->second].second;
                return true;
            }
            f.index.emplace(k, list.size());
        }
        list.emplace_back(std::move(k), nullptr);
        value_slot_ = &list.back().second;
        return true;
    }

    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
        error = e.what();
        return false;
    }

private:
    static constexpr size_t linear_scan_keys = 16;

    struct frame {
        json* container;
        std::unordered_map<std::string, size_t> index;  // key -> position, once the object has many keys
    };

    // Puts a value where the parser is: the root, the end of the open array, or the slot of the last key. Returns
    // where it went; the value a pointer names does not move while it is open (its parent only grows after it closes).
    json* put(json&& v) {
        if (open_.empty()) {
            root = std::move(v);
            return &root;
        }
        json& parent = *open_.back().container;
        if (parent.is_array()) {
            auto& items = parent.get_ref<json::array_t&>();
            items.push_back(std::move(v));
            return &items.back();
        }
        *value_slot_ = std::move(v);
        return value_slot_;
    }

    bool place(json&& v) {
        put(std::move(v));
        return true;
    }

    bool open(json&& container) {
        if (static_cast<int>(open_.size()) >= depth_limit_) {
            too_deep = true;
            return false;
        }
        json* at = put(std::move(container));
        open_.push_back({at, {}});
        return true;
    }

    bool close() {
        open_.pop_back();
        return true;
    }

    int depth_limit_;
    std::vector<frame> open_;
    json* value_slot_ = nullptr;
};

std::string depth_message(int limit) {
    return "nests deeper than " + std::to_string(limit) + " levels";
}

// The value a local JSON pointer ("#/$defs/a/0") names in `root`, resolved as llama.cpp's converter does (no ~0/~1
// unescaping); null when it names nothing.
const json* resolve_local_ref(const json& root, const std::string& ref) {
    const json* at = &root;
    size_t start = 2;  // after "#/"
    for (;;) {
        const size_t slash = ref.find('/', start);
        const std::string token = ref.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
        if (at->is_object()) {
            const auto it = at->find(token);
            if (it == at->end()) return nullptr;
            at = &*it;
        } else if (at->is_array()) {
            if (token.empty() || token.find_first_not_of("0123456789") != std::string::npos || token.size() > 9) {
                return nullptr;
            }
            const size_t i = std::stoul(token);
            if (i >= at->size()) return nullptr;
            at = &(*at)[i];
        } else {
            return nullptr;
        }
        if (slash == std::string::npos) return at;
        start = slash + 1;
    }
}

}  // namespace

namespace {

// Feeds a document simdjson has validated to the tree builder, as nlohmann's parser would: a non-negative integer is
// an unsigned number, a negative one an integer. False when the builder refuses (too deep); recursion stops there.
bool replay(const simdjson::dom::element& e, tree_builder& builder) {
    using simdjson::dom::element_type;
    switch (e.type()) {
        case element_type::ARRAY: {
            if (!builder.start_array(static_cast<std::size_t>(-1))) return false;
            const simdjson::dom::array items = e.get_array().value_unsafe();
            for (const simdjson::dom::element item : items) {
                if (!replay(item, builder)) return false;
            }
            return builder.end_array();
        }
        case element_type::OBJECT: {
            if (!builder.start_object(static_cast<std::size_t>(-1))) return false;
            const simdjson::dom::object fields = e.get_object().value_unsafe();
            for (const simdjson::dom::key_value_pair field : fields) {
                json::string_t key(field.key);
                builder.key(key);
                if (!replay(field.value, builder)) return false;
            }
            return builder.end_object();
        }
        case element_type::INT64: {
            const int64_t v = e.get_int64().value_unsafe();
            return v < 0 ? builder.number_integer(v) : builder.number_unsigned(static_cast<uint64_t>(v));
        }
        case element_type::UINT64:
            return builder.number_unsigned(e.get_uint64().value_unsafe());
        case element_type::DOUBLE:
            return builder.number_float(e.get_double().value_unsafe(), {});
        case element_type::STRING: {
            json::string_t v(e.get_string().value_unsafe());
            return builder.string(v);
        }
        case element_type::BOOL:
            return builder.boolean(e.get_bool().value_unsafe());
        case element_type::NULL_VALUE:
            return builder.null();
    }
    return false;
}

// simdjson's parse of `text` into `builder`; false when simdjson does not take it (not JSON, a number it does not
// hold, deeper than its own limit, or larger than fast_parse_bytes), and then nothing was built.
bool parse_fast(std::string_view text, tree_builder& builder) {
    // simdjson's document (up to ~15 bytes of buffers per byte of text, touched as the text needs) lives beside the
    // tree built from it: past this size, nlohmann's parser alone keeps the peak lower. Agent requests are far
    // smaller (a 128K-token conversation is ~0.5 MB).
    constexpr size_t fast_parse_bytes = size_t{8} << 20;
    if (text.size() > fast_parse_bytes) return false;
    // A connection's thread keeps its parser (buffers sized to the largest text it parsed) for texts up to this size;
    // a larger one gets a parser of its own, freed with it.
    constexpr size_t kept_parser_bytes = size_t{1} << 20;
    thread_local simdjson::dom::parser kept;
    std::optional<simdjson::dom::parser> own;
    simdjson::dom::parser& parser = text.size() <= kept_parser_bytes ? kept : own.emplace();
    simdjson::dom::element root;
    if (parser.parse(text.data(), text.size()).get(root) != simdjson::SUCCESS) return false;
    return replay(root, builder);
}

}  // namespace

json parse(std::string_view text, int depth_limit) {
    {
        // simdjson first (a 230 KB agent request: 0.1-0.3 ms where nlohmann took 1.6-1.7 ms); anything it refuses goes
        // through nlohmann's parser, whose answer (value or error message) is the reference.
        tree_builder builder(depth_limit);
        if (parse_fast(text, builder)) return std::move(builder.root);
        if (builder.too_deep) throw depth_error(depth_message(depth_limit));
    }
    tree_builder builder(depth_limit);
    const bool ok = json::sax_parse(text.begin(), text.end(), &builder);
    if (builder.too_deep) throw depth_error(depth_message(depth_limit));
    if (!ok) throw limit_error(builder.error.empty() ? "is not valid JSON" : builder.error);
    return std::move(builder.root);
}

std::optional<json> try_parse(std::string_view text, int depth_limit) {
    try {
        return parse(text, depth_limit);
    } catch (const limit_error&) {
        return std::nullopt;
    }
}

size_t check_shape(const json& value, const shape_limits& limits) {
    std::vector<std::pair<const json*, int>> pending{{&value, 0}};  // value, containers above it
    size_t values = 0;
    while (!pending.empty()) {
        const auto [v, above] = pending.back();
        pending.pop_back();
        if (++values > limits.values) {
            throw limit_error("has more than " + std::to_string(limits.values) + " values");
        }
        if (!v->is_structured()) continue;
        if (above + 1 > limits.depth) throw depth_error(depth_message(limits.depth));
        if (v->is_object() && v->size() > limits.object_keys) {
            throw limit_error("has an object with " + std::to_string(v->size()) + " keys; at most " +
                              std::to_string(limits.object_keys) + " are accepted");
        }
        for (const auto& child : *v) pending.emplace_back(&child, above + 1);
    }
    return values;
}

void check_schema(const json& schema) {
    const size_t schema_values = check_shape(schema, schema_shape);
    // A depth-first walk that expands each local "$ref" where it is used, like the converter, on an explicit stack: a
    // chain of refs nests as deep as the refs make it, whatever the text's own depth. A leave step takes a ref off the
    // path once its expansion is done, so that only a ref inside its own expansion counts as a cycle.
    struct step {
        const json* node;  // null for a leave step
        int depth;
        const std::string* leave_ref;
    };
    std::vector<step> pending{{&schema, 0, nullptr}};
    std::unordered_set<std::string> on_path;
    std::unordered_set<std::string> distinct_refs;
    size_t visited = 0;
    while (!pending.empty()) {
        const step s = pending.back();
        pending.pop_back();
        if (!s.node) {
            on_path.erase(*s.leave_ref);
            continue;
        }
        if (++visited > max_schema_expanded_values) {
            throw limit_error("expands to more than " + std::to_string(max_schema_expanded_values) +
                              " values once its $refs are followed");
        }
        if (!s.node->is_structured()) continue;
        if (s.depth + 1 > max_schema_expanded_depth) {
            throw limit_error("nests deeper than " + std::to_string(max_schema_expanded_depth) +
                              " levels once its $refs are followed");
        }
        for (const auto& child : *s.node) pending.push_back({&child, s.depth + 1, nullptr});
        if (!s.node->is_object()) continue;
        const auto ref = s.node->find("$ref");
        if (ref == s.node->end()) continue;
        if (!ref->is_string()) throw limit_error("has a '$ref' that is not a string");
        const std::string& target_name = ref->get_ref<const std::string&>();
        if (target_name.rfind("#/", 0) != 0 || on_path.count(target_name)) continue;
        const json* target = resolve_local_ref(schema, target_name);
        if (!target) continue;  // the converter reports it
        distinct_refs.insert(target_name);
        if (distinct_refs.size() > max_schema_refs || distinct_refs.size() * schema_values > max_schema_ref_copies) {
            throw limit_error("has too many distinct $refs for its size (" + std::to_string(distinct_refs.size()) +
                              " or more, in " + std::to_string(schema_values) + " values; refs times values at most " +
                              std::to_string(max_schema_ref_copies) + ", refs at most " +
                              std::to_string(max_schema_refs) + ")");
        }
        // Pushed after the children, so the expansion runs first with this ref on the path, then the leave step.
        on_path.insert(target_name);
        pending.push_back({nullptr, 0, &target_name});
        pending.push_back({target, s.depth + 1, nullptr});
    }
}

namespace {
[[noreturn]] void fail_field(const std::string& field, const limit_error& e) {
    throw request_error(400, "'" + field + "' " + e.what());
}
}  // namespace

void require_schema(const json& schema, const std::string& field) {
    try {
        check_schema(schema);
    } catch (const limit_error& e) {
        fail_field(field, e);
    }
}

void require_shape(const json& value, const std::string& field, const shape_limits& limits) {
    try {
        check_shape(value, limits);
    } catch (const limit_error& e) {
        fail_field(field, e);
    }
}

json require_json_text(std::string_view text, const std::string& field) {
    json value;
    try {
        value = parse(text);
    } catch (const depth_error& e) {
        fail_field(field, e);
    } catch (const limit_error& e) {
        throw request_error(400, "'" + field + "' must be a JSON-encoded string: " + e.what());
    }
    require_shape(value, field);
    return value;
}

}  // namespace keepwarm::bounded_json
