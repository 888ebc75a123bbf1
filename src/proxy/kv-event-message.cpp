// See kv-event-message.h.
#include "proxy/kv-event-message.h"

#include <xxhash.h>
#include <msgpack.hpp>

#include <cctype>
#include <stdexcept>

namespace keepwarm::proxy {

namespace {

// Thrown inside the decoder only; decode_kv_event_message turns it into its error.
struct bad_message : std::runtime_error {
    using std::runtime_error::runtime_error;
};

const msgpack::object_array& array_of(const msgpack::object& o, const char* what) {
    if (o.type != msgpack::type::ARRAY) throw bad_message(std::string(what) + " is not an array");
    return o.via.array;
}

bool is_nil(const msgpack::object& o) {
    return o.type == msgpack::type::NIL;
}

uint64_t unsigned_of(const msgpack::object& o, const char* what) {
    if (o.type != msgpack::type::POSITIVE_INTEGER) throw bad_message(std::string(what) + " is not an unsigned integer");
    return o.via.u64;
}

// vLLM's hashes are integers (signed ones too, from Python's hash()) or bytes (its sha256 hashes); only their
// equality matters here, so bytes are folded into 64 bits.
uint64_t hash_of(const msgpack::object& o) {
    switch (o.type) {
        case msgpack::type::POSITIVE_INTEGER:
            return o.via.u64;
        case msgpack::type::NEGATIVE_INTEGER:
            return static_cast<uint64_t>(o.via.i64);
        case msgpack::type::BIN:
            return XXH3_64bits(o.via.bin.ptr, o.via.bin.size);
        case msgpack::type::STR:
            return XXH3_64bits(o.via.str.ptr, o.via.str.size);
        default:
            throw bad_message("a block hash is neither an integer nor bytes");
    }
}

std::vector<uint64_t> hashes_of(const msgpack::object& o) {
    const msgpack::object_array& a = array_of(o, "block_hashes");
    std::vector<uint64_t> out;
    out.reserve(a.size);
    for (uint32_t i = 0; i < a.size; i++) out.push_back(hash_of(a.ptr[i]));
    return out;
}

std::string_view text_of(const msgpack::object& o, const char* what) {
    if (o.type != msgpack::type::STR) throw bad_message(std::string(what) + " is not a string");
    return {o.via.str.ptr, o.via.str.size};
}

// Absent or nil: the device, as llm-d reads it.
kv_medium medium_of(const msgpack::object_array& fields, uint32_t at) {
    if (fields.size <= at || is_nil(fields.ptr[at])) return kv_medium::device;
    const std::string_view m = text_of(fields.ptr[at], "medium");
    const auto is = [&](std::string_view name) {
        if (m.size() != name.size()) return false;
        for (size_t i = 0; i < m.size(); i++) {
            if (std::tolower(static_cast<unsigned char>(m[i])) != name[i]) return false;
        }
        return true;
    };
    if (is("gpu")) return kv_medium::device;
    if (is("cpu")) return kv_medium::ram;
    if (is("disk")) return kv_medium::disk;
    throw bad_message("unknown medium '" + std::string(m.substr(0, 32)) + "'");
}

kv_event event_of(const msgpack::object& o) {
    const msgpack::object_array& f = array_of(o, "an event");
    if (f.size == 0) throw bad_message("an event has no tag");
    const std::string_view tag = text_of(f.ptr[0], "an event's tag");
    if (tag == "BlockStored") {
        // [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id?, medium?, ...]
        if (f.size < 5) throw bad_message("BlockStored has fewer than 4 fields");
        kv_block_stored s;
        s.block_hashes = hashes_of(f.ptr[1]);
        if (!is_nil(f.ptr[2])) s.parent = hash_of(f.ptr[2]);
        const uint64_t block_size = unsigned_of(f.ptr[4], "block_size");
        if (block_size == 0 || block_size > max_kv_block_size) throw bad_message("block_size out of range");
        s.block_size = static_cast<uint32_t>(block_size);
        const msgpack::object_array& tokens = array_of(f.ptr[3], "token_ids");
        if (tokens.size != s.block_hashes.size() * block_size) {
            throw bad_message("BlockStored has " + std::to_string(tokens.size) + " tokens for " +
                              std::to_string(s.block_hashes.size()) + " blocks of " + std::to_string(block_size));
        }
        s.token_ids.reserve(tokens.size);
        for (uint32_t i = 0; i < tokens.size; i++) {
            const uint64_t t = unsigned_of(tokens.ptr[i], "a token id");
            if (t > INT32_MAX) throw bad_message("a token id is out of range");
            s.token_ids.push_back(static_cast<int32_t>(t));
        }
        if (f.size > 5 && !is_nil(f.ptr[5])) throw bad_message("BlockStored of a LoRA adapter");
        s.medium = medium_of(f, 6);
        return s;
    }
    if (tag == "BlockRemoved") {
        if (f.size < 2) throw bad_message("BlockRemoved has no block_hashes");
        return kv_block_removed{.block_hashes = hashes_of(f.ptr[1]), .medium = medium_of(f, 2)};
    }
    if (tag == "AllBlocksCleared") return kv_all_cleared{};
    throw bad_message("unknown event '" + std::string(tag.substr(0, 32)) + "'");
}

}  // namespace

const char* kv_medium_name(kv_medium m) {
    switch (m) {
        case kv_medium::device:
            return "gpu";
        case kv_medium::ram:
            return "cpu";
        case kv_medium::disk:
            return "disk";
    }
    return "?";
}

std::optional<kv_event_message> decode_kv_event_message(std::span<const std::string_view> frames, std::string& error) {
    if (frames.size() != 3) {
        error = "a message has " + std::to_string(frames.size()) + " frames, not 3";
        return std::nullopt;
    }
    if (frames[1].size() != 8) {
        error = "the sequence frame has " + std::to_string(frames[1].size()) + " bytes, not 8";
        return std::nullopt;
    }
    if (frames[2].size() > max_kv_message_bytes) {
        error = "the payload has " + std::to_string(frames[2].size()) + " bytes";
        return std::nullopt;
    }
    kv_event_message m;
    m.topic = std::string(frames[0]);
    for (const char c : frames[1]) m.seq = (m.seq << 8) | static_cast<uint8_t>(c);
    try {
        // msgpack-c bounds nesting and sizes by these limits before it allocates.
        const msgpack::unpack_limit limits(/*array=*/1u << 24, /*map=*/1024, /*str=*/1u << 20, /*bin=*/1u << 20,
                                           /*ext=*/1u << 20, /*depth=*/8);
        const msgpack::object_handle handle =
            msgpack::unpack(frames[2].data(), frames[2].size(), nullptr, nullptr, limits);
        const msgpack::object_array& batch = array_of(handle.get(), "the payload");
        if (batch.size < 2 || batch.size > 3) throw bad_message("the payload is not [ts, events, dp_rank]");
        const msgpack::object_array& events = array_of(batch.ptr[1], "events");
        m.events.reserve(events.size);
        for (uint32_t i = 0; i < events.size; i++) m.events.push_back(event_of(events.ptr[i]));
    } catch (const bad_message& e) {
        error = e.what();
        return std::nullopt;
    } catch (const std::exception& e) {  // msgpack's own: truncated, over a limit, a wrong type
        error = std::string("msgpack: ") + e.what();
        return std::nullopt;
    }
    return m;
}

}  // namespace keepwarm::proxy
