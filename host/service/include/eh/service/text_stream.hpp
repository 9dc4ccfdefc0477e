// Incremental detokenization: tokens in, UTF-8 text out, never splitting a
// character. Decoding a window of recent tokens (rather than one token at a
// time) keeps tokenizers that strip a leading space at the start of a text
// from eating spaces in the middle of the stream.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "eh/service/text_codec.hpp"

namespace eh::service {

class TextStream {
public:
    // `context`: the last few prompt tokens. Their text counts as already
    // sent, so the first generated token keeps its leading space.
    // `control_text`: control tokens are written as their text (harmony).
    explicit TextStream(const TextCodec& codec, std::span<const int32_t> context = {}, bool control_text = false)
        : codec_(codec), tokens_(context.begin(), context.end()), read_(context.size()), control_text_(control_text) {}
    // Text completed by this token (may be empty while a character or a
    // multi-token sequence is incomplete).
    std::string push(int32_t token);
    // Whatever is still held back, with invalid bytes replaced by U+FFFD.
    std::string finish();

private:
    const TextCodec& codec_;
    std::vector<int32_t> tokens_;
    size_t prefix_ = 0;  // window start: text before it is settled
    size_t read_ = 0;    // tokens whose text was emitted
    bool control_text_ = false;
    std::string decode(std::span<const int32_t> ids) const {
        return control_text_ ? codec_.decode_with_control(ids) : codec_.decode(ids);
    }
};

}  // namespace eh::service
