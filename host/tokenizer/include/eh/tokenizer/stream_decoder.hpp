// Incremental detokenisation for streaming: feed ids as they are sampled,
// get back only text that is complete, valid UTF-8.
//
// A codepoint split across tokens (byte-fallback <0xE2><0x82><0xAC>, or a
// byte-level BPE token holding half an emoji) is held back until its last
// byte arrives, so the stream never carries U+FFFD for text the model did
// produce correctly. Bytes that can never become valid UTF-8 (0xFF, a stray
// continuation byte, a lead byte followed by a non-continuation byte) are
// replaced right away by U+FFFD, one per maximal invalid subpart as in the
// Unicode Standard's "substitution of maximal subparts" (the WHATWG
// decoder's rule). flush() at the end replaces a still-incomplete tail the
// same way (one U+FFFD). Concatenating every feed() and the final flush()
// gives exactly the deterministic valid-UTF-8 rendering of decode(ids).
#pragma once

#include <cstdint>
#include <string>

#include "eh/tokenizer/tokenizer.hpp"

namespace eh::tokenizer {

// Replaces invalid UTF-8 as the stream decoder does (complete input).
std::string sanitize_utf8(std::string_view bytes);

class StreamDecoder {
public:
    // include_special: render control tokens as their text.
    // strip_leading_space: drop one space at the very start of the stream
    // (what decode() does for SPM-style models); off by default because a
    // generated stream usually continues a prompt and its first space is real.
    explicit StreamDecoder(const Tokenizer& tok, bool include_special = false, bool strip_leading_space = false);

    // Appends the token; returns the text that became complete.
    std::string feed(int32_t id);
    // Feeds raw bytes (tests; or text that bypasses the tokenizer).
    std::string feed_bytes(std::string_view bytes);
    // End of stream: what remains, invalid tail replaced by U+FFFD.
    std::string flush();
    // Bytes held back waiting for the rest of a codepoint (0..3).
    size_t pending() const { return pending_.size(); }

private:
    const Tokenizer& tok_;
    bool include_special_;
    bool strip_space_;
    bool at_start_ = true;
    std::string pending_;
};

}  // namespace eh::tokenizer
