// The gauntlet's replay client: sends one streamed request to a target (OpenAI /v1/chat/completions or Anthropic
// /v1/messages) on http::client_connection, parses the SSE stream into the answer, and reads what the server says
// it reused and computed (keepwarm's and llama-server's usage and timings fields), with TTFT, the gaps between the
// answer's tokens and total time.
// Threading: send_request runs on the calling thread; cancel a blocked one through the connection it was given.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "bench/gauntlet-conversation.h"
#include "bench/gauntlet-workload.h"
#include "http/http-client.h"

namespace keepwarm::bench::gauntlet {

// Server-Sent Events, fed in pieces as they arrive off the socket.
struct sse_event {
    std::string event;  // "" when the event has no `event:` line (OpenAI)
    std::string data;   // `data:` lines joined by '\n'
};

class sse_reader {
public:
    // The events completed by this piece (an event ends at a blank line; "\r\n" line ends are accepted).
    std::vector<sse_event> feed(std::string_view piece);

private:
    std::string buffer_;
    sse_event current_;
    bool has_data_ = false;
};

// What a server reports about a request's prompt. -1: not reported.
struct prompt_numbers {
    int prompt_tokens = -1;
    int reused_tokens = -1;    // usage.prompt_tokens_details.cached_tokens, timings.cache_n, cache_read_input_tokens
    int computed_tokens = -1;  // timings.prompt_n, else prompt - reused
    double prompt_ms = -1;     // timings.prompt_ms: the server's prefill time
    // keepwarm's timings.sampling_ms and sampling_max_ms: the engine thread's time in the sampler over the answer
    // (a grammar's checks included), and the longest one token took.
    double sampling_ms = -1;
    double sampling_max_ms = -1;

    // Fills prompt / computed from the others where the server left them out.
    void complete();
};

// Read the numbers from one parsed OpenAI chunk / Anthropic event's data, keeping earlier values the event lacks
// (Anthropic's message_start counts everything as created; message_delta has the final split).
void read_openai_numbers(const json& chunk, prompt_numbers& numbers);
void read_anthropic_numbers(const json& event, prompt_numbers& numbers);

struct request_result {
    bool ok = false;
    std::string error;  // HTTP status and message, or the connection failure
    int status = 0;
    double ttft_ms = -1;  // to the first chunk with answer text (or the end, when the answer is empty)
    double total_ms = 0;
    int answer_chunks = 0;
    // Between consecutive answer chunks as they came off the socket (chunks read together: 0): how long a user
    // watching the stream waited for each next token, e.g. while another client's prompt was prefilled.
    std::vector<double> token_gaps_ms;
    bool cancelled = false;  // closed after cancel_after_chunks
    prompt_numbers numbers;
    assistant_answer answer;
};

// Sends `body` (stream forced on; OpenAI also asks for usage) and reads the stream to its end, or closes the
// connection after `cancel_after_chunks` answer chunks (0: never). Never throws: failures are in the result.
request_result send_request(http::client_connection& connection, wire_api api, json body, int cancel_after_chunks);

}  // namespace keepwarm::bench::gauntlet
