// See gauntlet-client.h.
#include "bench/gauntlet-client.h"

#include <chrono>
#include <map>

namespace keepwarm::bench::gauntlet {

namespace {

using clock_type = std::chrono::steady_clock;

int int_field(const json& object, const char* key, int fallback) {
    const auto it = object.find(key);
    return it != object.end() && it->is_number() ? it->get<int>() : fallback;
}

void read_timings(const json& data, prompt_numbers& n) {
    const auto timings = data.find("timings");
    if (timings == data.end() || !timings->is_object()) return;
    n.reused_tokens = int_field(*timings, "cache_n", n.reused_tokens);
    n.computed_tokens = int_field(*timings, "prompt_n", n.computed_tokens);
    const auto ms_field = [&](const char* key, double& out) {
        if (const auto ms = timings->find(key); ms != timings->end() && ms->is_number()) out = ms->get<double>();
    };
    ms_field("prompt_ms", n.prompt_ms);
    ms_field("sampling_ms", n.sampling_ms);
    ms_field("sampling_max_ms", n.sampling_max_ms);
}

// The error message of an error body in either API's shape, else the body itself (shortened).
std::string error_message(const std::string& body) {
    try {
        const json j = json::parse(body);
        if (j.contains("error") && j["error"].is_object()) return j["error"].value("message", body);
        if (j.contains("error") && j["error"].is_string()) return j["error"].get<std::string>();
    } catch (const json::parse_error&) {
    }
    return body.substr(0, 300);
}

}  // namespace

std::vector<sse_event> sse_reader::feed(std::string_view piece) {
    buffer_.append(piece);
    std::vector<sse_event> done;
    size_t start = 0;
    while (true) {
        const size_t end = buffer_.find('\n', start);
        if (end == std::string::npos) break;
        std::string_view line(buffer_.data() + start, end - start);
        start = end + 1;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.empty()) {
            if (has_data_ || !current_.event.empty()) done.push_back(std::move(current_));
            current_ = {};
            has_data_ = false;
            continue;
        }
        if (line.front() == ':') continue;  // a comment (keep-alive)
        const size_t colon = line.find(':');
        const std::string_view field = line.substr(0, colon);
        std::string_view value = colon == std::string_view::npos ? std::string_view{} : line.substr(colon + 1);
        if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
        if (field == "event") {
            current_.event = value;
        } else if (field == "data") {
            if (has_data_) current_.data += '\n';
            current_.data += value;
            has_data_ = true;
        }
    }
    buffer_.erase(0, start);
    return done;
}

void prompt_numbers::complete() {
    if (prompt_tokens < 0 && reused_tokens >= 0 && computed_tokens >= 0)
        prompt_tokens = reused_tokens + computed_tokens;
    if (computed_tokens < 0 && prompt_tokens >= 0 && reused_tokens >= 0)
        computed_tokens = prompt_tokens - reused_tokens;
    if (reused_tokens < 0 && prompt_tokens >= 0 && computed_tokens >= 0)
        reused_tokens = prompt_tokens - computed_tokens;
}

void read_openai_numbers(const json& chunk, prompt_numbers& n) {
    if (const auto usage = chunk.find("usage"); usage != chunk.end() && usage->is_object()) {
        n.prompt_tokens = int_field(*usage, "prompt_tokens", n.prompt_tokens);
        if (const auto details = usage->find("prompt_tokens_details");
            details != usage->end() && details->is_object()) {
            n.reused_tokens = int_field(*details, "cached_tokens", n.reused_tokens);
        }
    }
    const int reused = n.reused_tokens;
    read_timings(chunk, n);
    if (reused >= 0) n.reused_tokens = reused;  // usage's cached_tokens first, as keepwarm documents it
}

void read_anthropic_numbers(const json& event, prompt_numbers& n) {
    const json* usage = nullptr;
    if (event.contains("usage") && event["usage"].is_object()) usage = &event["usage"];
    if (event.contains("message") && event["message"].is_object() && event["message"].contains("usage")) {
        usage = &event["message"]["usage"];
    }
    if (usage && usage->is_object()) {
        const int input = int_field(*usage, "input_tokens", -1);
        const int read = int_field(*usage, "cache_read_input_tokens", -1);
        const int created = int_field(*usage, "cache_creation_input_tokens", -1);
        if (input >= 0 || read >= 0 || created >= 0) {
            n.prompt_tokens = std::max(input, 0) + std::max(read, 0) + std::max(created, 0);
            n.reused_tokens = std::max(read, 0);
            n.computed_tokens = n.prompt_tokens - n.reused_tokens;
        }
    }
    read_timings(event, n);
}

request_result send_request(http::client_connection& connection, wire_api api, json body, int cancel_after_chunks) {
    request_result r;
    body["stream"] = true;
    if (api == wire_api::openai) body["stream_options"] = {{"include_usage", true}};
    const std::string text = body.dump(-1, ' ', false, json::error_handler_t::replace);
    http::header_list headers;
    if (api == wire_api::anthropic) headers = {{"anthropic-version", "2023-06-01"}, {"x-api-key", "none"}};
    const auto started = clock_type::now();
    const auto elapsed_ms = [&] {
        return std::chrono::duration<double, std::milli>(clock_type::now() - started).count();
    };
    std::map<int, tool_call_record> calls;  // by stream index
    bool finished = false;
    bool final_numbers = false;  // the event with the server's final split arrived
    try {
        const http::client_response head =
            connection.send("POST", api == wire_api::openai ? "/v1/chat/completions" : "/v1/messages", text,
                            "application/json", headers);
        r.status = head.status;
        if (head.status != 200) {
            r.error = "HTTP " + std::to_string(head.status) + ": " + error_message(connection.read_body());
            r.total_ms = elapsed_ms();
            return r;
        }
        sse_reader reader;
        std::string piece;
        double last_chunk_ms = 0;
        while (!finished && connection.read_some(piece)) {
            const double arrived_ms = elapsed_ms();  // every event of this piece came off the socket together
            for (const sse_event& e : reader.feed(piece)) {
                if (e.data == "[DONE]") {
                    finished = true;
                    break;
                }
                json data;
                try {
                    data = json::parse(e.data);
                } catch (const json::parse_error&) {
                    throw std::runtime_error("the stream sent data that is not JSON: " + e.data.substr(0, 200));
                }
                if (data.contains("error")) throw std::runtime_error("the stream reported: " + data.dump());
                bool answer_chunk = false;
                if (api == wire_api::openai) {
                    read_openai_numbers(data, r.numbers);
                    final_numbers = final_numbers || data.contains("usage") || data.contains("timings");
                    const json choices = data.value("choices", json::array());
                    if (!choices.empty() && choices[0].is_object()) {
                        const json delta = choices[0].value("delta", json::object());
                        if (delta.contains("content") && delta["content"].is_string()) {
                            r.answer.content += delta["content"].get<std::string>();
                            answer_chunk = true;
                        }
                        if (delta.contains("reasoning_content") && delta["reasoning_content"].is_string()) {
                            r.answer.reasoning += delta["reasoning_content"].get<std::string>();
                            answer_chunk = true;
                        }
                        for (const json& call : delta.value("tool_calls", json::array())) {
                            tool_call_record& c = calls[call.value("index", 0)];
                            if (call.contains("id") && call["id"].is_string()) c.id = call["id"];
                            const json function = call.value("function", json::object());
                            if (function.contains("name") && function["name"].is_string()) c.name = function["name"];
                            if (function.contains("arguments") && function["arguments"].is_string()) {
                                c.arguments += function["arguments"].get<std::string>();
                            }
                            answer_chunk = true;
                        }
                        if (r.ttft_ms < 0 && choices[0].contains("finish_reason") &&
                            !choices[0]["finish_reason"].is_null()) {
                            r.ttft_ms = elapsed_ms();  // an empty answer: its first token is its end
                        }
                    }
                } else {
                    read_anthropic_numbers(data, r.numbers);
                    const std::string type = data.value("type", e.event);
                    final_numbers = final_numbers || type == "message_delta";
                    if (type == "content_block_start") {
                        const json block = data.value("content_block", json::object());
                        if (block.value("type", "") == "tool_use") {
                            calls[data.value("index", 0)] = {block.value("id", ""), block.value("name", ""), ""};
                        }
                    } else if (type == "content_block_delta") {
                        const json delta = data.value("delta", json::object());
                        const std::string kind = delta.value("type", "");
                        if (kind == "text_delta") r.answer.content += delta.value("text", "");
                        if (kind == "thinking_delta") r.answer.reasoning += delta.value("thinking", "");
                        if (kind == "input_json_delta")
                            calls[data.value("index", 0)].arguments += delta.value("partial_json", "");
                        answer_chunk = kind == "text_delta" || kind == "thinking_delta" || kind == "input_json_delta";
                    } else if (type == "message_delta" && r.ttft_ms < 0) {
                        r.ttft_ms = elapsed_ms();
                    } else if (type == "message_stop") {
                        finished = true;
                    } else if (type == "error") {
                        throw std::runtime_error("the stream reported: " + data.dump());
                    }
                }
                if (answer_chunk) {
                    if (r.ttft_ms < 0) r.ttft_ms = arrived_ms;
                    if (r.answer_chunks > 0) r.token_gaps_ms.push_back(arrived_ms - last_chunk_ms);
                    last_chunk_ms = arrived_ms;
                    ++r.answer_chunks;
                    if (cancel_after_chunks > 0 && r.answer_chunks >= cancel_after_chunks) {
                        r.cancelled = true;
                        finished = true;
                        break;
                    }
                }
            }
        }
        if (r.cancelled) {
            connection.cancel();  // the client goes away mid-answer, as a user pressing Esc
            // The usage comes at the end of a stream; what came before (Anthropic's message_start counts the whole
            // prompt as created) is not what the server did.
            if (!final_numbers) r.numbers = {};
        } else {
            // The rest of the body (a final [DONE] after message_stop, the chunked terminator) keeps the
            // connection reusable; its end says the stream really ended.
            while (connection.read_some(piece)) {
            }
            if (!finished) throw std::runtime_error("the stream ended before its last event");
        }
        r.ok = true;
    } catch (const std::exception& e) {
        r.error = e.what();
    }
    r.total_ms = elapsed_ms();
    if (r.ok && r.ttft_ms < 0) r.ttft_ms = r.total_ms;
    for (auto& [index, call] : calls) r.answer.tool_calls.push_back(std::move(call));
    r.numbers.complete();
    return r;
}

}  // namespace keepwarm::bench::gauntlet
