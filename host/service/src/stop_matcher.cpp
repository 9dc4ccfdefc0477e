#include "eh/service/stop_matcher.hpp"

#include <algorithm>

namespace eh::service {

StopMatcher::Result StopMatcher::feed(std::string_view text) {
    held_.append(text);
    Result r;
    size_t first = std::string::npos;
    for (const auto& s : stops_) {
        if (s.empty()) continue;
        size_t p = held_.find(s);
        if (p != std::string::npos && p < first) {
            first = p;
            matched_ = s;
        }
    }
    if (first != std::string::npos) {
        r.emit = held_.substr(0, first);
        r.stopped = true;
        held_.clear();
        return r;
    }
    // Longest suffix of held_ that is a proper prefix of some stop string.
    size_t keep = 0;
    for (const auto& s : stops_) {
        size_t max = std::min(s.size() - (s.empty() ? 0 : 1), held_.size());
        for (size_t n = max; n > keep; --n) {
            if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
                keep = n;
                break;
            }
        }
    }
    r.emit = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return r;
}

std::string StopMatcher::flush() {
    std::string out;
    out.swap(held_);
    return out;
}

}  // namespace eh::service
