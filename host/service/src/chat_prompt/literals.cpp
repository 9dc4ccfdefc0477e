#include "eh/service/chat_prompt.hpp"

#include <algorithm>

namespace eh::service {
namespace {

constexpr std::string_view kOpen = "\xEE\x80\x80";   // U+E000
constexpr std::string_view kClose = "\xEE\x80\x81";  // U+E001

}  // namespace

ChatLiterals::ChatLiterals(std::vector<std::string> specials) {
    std::erase_if(specials, [](const std::string& s) { return s.empty(); });
    std::stable_sort(specials.begin(), specials.end(),
                     [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
    texts_.push_back(std::string(kOpen));
    for (auto& s : specials) texts_.push_back(std::move(s));
    for (size_t k = 0; k < texts_.size(); ++k) by_first_[static_cast<unsigned char>(texts_[k][0])].push_back(k);
}

std::string ChatLiterals::mark(std::string_view content) const {
    std::string out;
    out.reserve(content.size());
    size_t i = 0;
    while (i < content.size()) {
        size_t hit = texts_.size();
        for (size_t k : by_first_[static_cast<unsigned char>(content[i])])
            if (content.compare(i, texts_[k].size(), texts_[k]) == 0) {
                hit = k;
                break;
            }
        if (hit == texts_.size()) {
            out += content[i++];
            continue;
        }
        out += kOpen;
        out += std::to_string(hit);
        out += kClose;
        i += texts_[hit].size();
    }
    return out;
}

std::vector<ChatMessage> ChatLiterals::mark(const std::vector<ChatMessage>& messages) const {
    std::vector<ChatMessage> out = messages;
    // Every text of a message a template may write (tool-call fields too).
    for (auto& m : out) {
        if (!m.image_at.empty()) {
            std::string c;
            size_t at = 0;
            for (size_t pos : m.image_at) {
                pos = std::clamp(pos, at, m.content.size());
                c += mark(std::string_view(m.content).substr(at, pos - at));
                c += kImageMarker;
                at = pos;
            }
            m.content = c + mark(std::string_view(m.content).substr(at));
        } else {
            m.content = mark(m.content);
        }
        m.reasoning = mark(m.reasoning);
        m.tool_call_id = mark(m.tool_call_id);
        m.name = mark(m.name);
        for (auto& c : m.tool_calls) {
            c.id = mark(c.id);
            c.name = mark(c.name);
            c.arguments = mark(c.arguments);
        }
    }
    return out;
}

ChatPrompt ChatLiterals::unmark(std::string_view rendered) const {
    ChatPrompt p;
    p.text.reserve(rendered.size());
    size_t i = 0;
    while (i < rendered.size()) {
        size_t at = rendered.find(kOpen, i);
        if (at == std::string_view::npos) break;
        p.text.append(rendered.substr(i, at - i));
        // Digits, then the closing mark; anything else is not a marker (the
        // template wrote U+E000 itself) and stays as it is.
        size_t d = at + kOpen.size(), e = d;
        while (e < rendered.size() && e - d < 6 && rendered[e] >= '0' && rendered[e] <= '9') ++e;
        size_t k = e > d ? std::stoul(std::string(rendered.substr(d, e - d))) : texts_.size();
        if (k < texts_.size() && rendered.compare(e, kClose.size(), kClose) == 0) {
            p.literal.push_back({p.text.size(), p.text.size() + texts_[k].size()});
            p.text += texts_[k];
            i = e + kClose.size();
        } else {
            p.text += kOpen;
            i = d;
        }
    }
    p.text.append(rendered.substr(i));
    return p;
}

}  // namespace eh::service
