#include "eh/tokenizer/stream_decoder.hpp"

#include "unicode.hpp"

namespace eh::tokenizer {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// Moves the longest decidable prefix of `in` to `out` (invalid parts
// replaced) and returns how many bytes at the end are an incomplete but
// still valid sequence (left in place when !final).
size_t drain(std::string_view in, std::string& out, bool final) {
    size_t i = 0;
    while (i < in.size()) {
        const int state = unicode::utf8_prefix_state(in, i);
        if (state > 0) {
            out.append(in.substr(i, static_cast<size_t>(state)));
            i += static_cast<size_t>(state);
        } else if (state < 0) {
            if (!final) return in.size() - i;
            out.append(kReplacement);  // an unfinished sequence at the end
            return 0;
        } else {
            // Maximal subpart: the lead byte plus the continuation bytes that
            // were still acceptable after it form one replaced unit.
            size_t len = 1;
            const auto b0 = static_cast<uint8_t>(in[i]);
            const size_t need = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : b0 >= 0xC2 ? 2 : 1;
            while (len < need && i + len < in.size() &&
                   unicode::utf8_prefix_state(in.substr(i, len + 1), 0) < 0)
                ++len;
            out.append(kReplacement);
            i += len;
        }
    }
    return 0;
}

}  // namespace

std::string sanitize_utf8(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size());
    drain(bytes, out, true);
    return out;
}

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool include_special, bool strip_leading_space)
    : tok_(tok), include_special_(include_special), strip_space_(strip_leading_space) {}

std::string StreamDecoder::feed(int32_t id) { return feed_bytes(tok_.token_to_piece(id, include_special_)); }

std::string StreamDecoder::feed_bytes(std::string_view bytes) {
    pending_.append(bytes);
    if (at_start_ && !pending_.empty()) {
        at_start_ = false;
        if (strip_space_ && pending_[0] == ' ') pending_.erase(0, 1);
    }
    std::string out;
    const size_t keep = drain(pending_, out, false);
    pending_.erase(0, pending_.size() - keep);
    return out;
}

std::string StreamDecoder::flush() {
    std::string out;
    drain(pending_, out, true);
    pending_.clear();
    return out;
}

}  // namespace eh::tokenizer
