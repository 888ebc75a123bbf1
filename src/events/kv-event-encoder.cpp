// See kv-event-encoder.h. The layouts are those of vLLM's msgspec structs (array_like, tagged by class name) and of
// llm-d-kv-cache-manager's decoder (docs/kv-events.md names the sources).
#include "events/kv-event-encoder.h"

#include <array>

#include <msgpack.hpp>

namespace keepwarm::events {

std::string_view medium_name(kv_medium medium) {
    switch (medium) {
        case kv_medium::device:
            return "GPU";
        case kv_medium::ram:
            return "CPU";
        case kv_medium::disk:
            return "DISK";
    }
    return "GPU";
}

std::vector<wire_event> group_changes(std::span<const kv_block_change> changes, size_t max_blocks) {
    std::vector<wire_event> out;
    std::array<std::optional<size_t>, kv_medium_count> open_run{};  // per medium: the event a child may join
    std::optional<size_t> open_removal;
    for (const kv_block_change& c : changes) {
        auto& run = open_run[static_cast<size_t>(c.medium)];
        if (!c.stored) {
            if (!open_removal || out[*open_removal].medium != c.medium ||
                out[*open_removal].hashes.size() >= max_blocks) {
                out.push_back({.what = wire_event::kind::block_removed, .medium = c.medium});
                open_removal = out.size() - 1;
            }
            out[*open_removal].hashes.push_back(c.hash);
            continue;
        }
        const bool joins = run && out[*run].hashes.size() < max_blocks && c.parent == out[*run].hashes.back();
        const bool continues = run && c.parent == out[*run].hashes.back();
        if (!joins) {
            wire_event e{.what = wire_event::kind::block_stored, .medium = c.medium};
            e.parent = continues ? std::optional(out[*run].hashes.back()) : c.parent;
            out.push_back(std::move(e));
            run = out.size() - 1;
        }
        out[*run].hashes.push_back(c.hash);
        out[*run].tokens.insert(out[*run].tokens.end(), c.tokens.begin(), c.tokens.end());
        open_removal.reset();  // removals after a store start a new event: the order of changes is kept
    }
    return out;
}

std::string encode_batch(double timestamp, std::span<const wire_event> events, int block_size) {
    msgpack::sbuffer buffer;
    msgpack::packer<msgpack::sbuffer> pk(buffer);
    pk.pack_array(3);
    pk.pack_double(timestamp);
    pk.pack_array(static_cast<uint32_t>(events.size()));
    const auto pack_hashes = [&](const std::vector<uint64_t>& hashes) {
        pk.pack_array(static_cast<uint32_t>(hashes.size()));
        for (const uint64_t h : hashes) pk.pack_uint64(h);
    };
    const auto pack_string = [&](std::string_view s) {
        pk.pack_str(static_cast<uint32_t>(s.size()));
        pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
    };
    for (const wire_event& e : events) {
        switch (e.what) {
            case wire_event::kind::block_stored:
                pk.pack_array(7);
                pack_string("BlockStored");
                pack_hashes(e.hashes);
                if (e.parent) {
                    pk.pack_uint64(*e.parent);
                } else {
                    pk.pack_nil();
                }
                pk.pack_array(static_cast<uint32_t>(e.tokens.size()));
                for (const llama_token t : e.tokens) pk.pack_uint32(static_cast<uint32_t>(t));
                pk.pack_int(block_size);
                pk.pack_nil();  // lora_id: no adapters
                pack_string(medium_name(e.medium));
                break;
            case wire_event::kind::block_removed:
                pk.pack_array(3);
                pack_string("BlockRemoved");
                pack_hashes(e.hashes);
                pack_string(medium_name(e.medium));
                break;
            case wire_event::kind::all_blocks_cleared:
                pk.pack_array(1);
                pack_string("AllBlocksCleared");
                break;
        }
    }
    pk.pack_int(0);  // dp_rank
    return {buffer.data(), buffer.size()};
}

std::string sequence_frame(uint64_t sequence) {
    std::string out(8, '\0');
    for (int i = 7; i >= 0; --i) {
        out[static_cast<size_t>(i)] = static_cast<char>(sequence & 0xff);
        sequence >>= 8;
    }
    return out;
}

std::string event_topic(std::string_view pod, std::string_view model) {
    std::string out = "kv@";
    out.append(pod).append("@").append(model);
    return out;
}

}  // namespace keepwarm::events
