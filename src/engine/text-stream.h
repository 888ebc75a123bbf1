// Turns token pieces into text a client may see at once: never splits a UTF-8 character, never shows the
// start of what may turn out to be a stop string, and never emits invalid UTF-8 (replaced by U+FFFD).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace keepwarm {

class text_stream {
public:
    explicit text_stream(std::vector<std::string> stop_strings = {});

    // Appends a token's bytes; returns the text that is now safe to emit. After a stop string completes,
    // stopped() is true, the returned text ends right before it, and further pushes return nothing.
    std::string push(std::string_view piece);

    // End of generation: returns what was held back (a partial stop string is real text after all).
    // An incomplete UTF-8 character at the very end is replaced by U+FFFD.
    std::string finish();

    bool stopped() const { return stopped_; }
    const std::string& matched_stop() const { return matched_stop_; }

private:
    std::vector<std::string> stops_;
    std::string held_;          // valid UTF-8 held back because it may begin a stop string
    std::string partial_utf8_;  // bytes of a UTF-8 character not complete yet
    bool stopped_ = false;
    std::string matched_stop_;
};

// Replaces invalid UTF-8 sequences by U+FFFD. Exposed for tests and for text from other sources.
std::string sanitize_utf8(std::string_view bytes);

}  // namespace keepwarm
