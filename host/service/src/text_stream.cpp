#include "eh/service/text_stream.hpp"

#include <span>

#include "eh/service/utf8.hpp"

namespace eh::service {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
// A decoder that substitutes U+FFFD for a split character gets this many
// tokens to complete it before the replacement is emitted as is.
constexpr size_t kMaxHeldTokens = 4;

}  // namespace

std::string TextStream::push(int32_t token) {
    tokens_.push_back(token);
    std::span<const int32_t> all(tokens_);
    std::string before = decode(all.subspan(prefix_, read_ - prefix_));
    std::string now = decode(all.subspan(prefix_));
    if (now.size() <= before.size()) return {};
    std::string_view fresh = std::string_view(now).substr(before.size());
    bool incomplete = complete_utf8_prefix(fresh) != fresh.size() ||
                      (fresh.size() >= 3 && fresh.substr(fresh.size() - 3) == kReplacement);
    if (incomplete && tokens_.size() - read_ < kMaxHeldTokens) return {};
    std::string out = sanitize_utf8(fresh);
    prefix_ = read_;
    read_ = tokens_.size();
    return out;
}

std::string TextStream::finish() {
    if (read_ == tokens_.size()) return {};
    std::span<const int32_t> all(tokens_);
    std::string before = decode(all.subspan(prefix_, read_ - prefix_));
    std::string now = decode(all.subspan(prefix_));
    prefix_ = read_ = tokens_.size();
    if (now.size() <= before.size()) return {};
    return sanitize_utf8(std::string_view(now).substr(before.size()));
}

}  // namespace eh::service
