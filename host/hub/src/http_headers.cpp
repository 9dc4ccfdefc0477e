#include "eh/hub/http_headers.hpp"

#include <algorithm>
#include <charconv>

namespace eh::hub {

std::optional<ContentRange> parse_content_range(std::string_view v) {
    if (v.substr(0, 6) != "bytes ") return std::nullopt;
    const char* p = v.data() + 6;
    const char* end = v.data() + v.size();
    ContentRange r;
    auto a = std::from_chars(p, end, r.start);
    if (a.ec != std::errc() || a.ptr == end || *a.ptr != '-') return std::nullopt;
    uint64_t last = 0;
    auto b = std::from_chars(a.ptr + 1, end, last);
    if (b.ec != std::errc() || b.ptr == end || *b.ptr != '/' || last < r.start) return std::nullopt;
    std::string_view total(b.ptr + 1, size_t(end - b.ptr - 1));
    if (total == "*") return r;
    auto c = std::from_chars(total.data(), total.data() + total.size(), r.total);
    if (c.ec != std::errc() || c.ptr != total.data() + total.size() || r.total <= last) return std::nullopt;
    return r;
}

std::string next_link(std::string_view link) {
    for (size_t at = 0; (at = link.find('<', at)) != std::string_view::npos;) {
        size_t close = link.find('>', at);
        if (close == std::string_view::npos) break;
        size_t comma = link.find(',', close);
        std::string_view params = link.substr(close + 1, comma == std::string_view::npos ? std::string_view::npos
                                                                                         : comma - close - 1);
        if (params.find("rel=\"next\"") != std::string_view::npos || params.find("rel=next") != std::string_view::npos)
            return std::string(link.substr(at + 1, close - at - 1));
        at = close;
    }
    return "";
}

std::string unquote_etag(std::string_view e) {
    if (e.substr(0, 2) == "W/") e.remove_prefix(2);
    if (e.size() >= 2 && e.front() == '"' && e.back() == '"') e = e.substr(1, e.size() - 2);
    return std::string(e);
}

}  // namespace eh::hub
