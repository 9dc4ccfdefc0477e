#include "eh/model/gguf_split.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>

namespace eh::model {

namespace {

bool ends_with_gguf(std::string_view f) {
    if (f.size() < 5) return false;
    std::string tail(f.substr(f.size() - 5));
    std::transform(tail.begin(), tail.end(), tail.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    return tail == ".gguf";
}

}  // namespace

std::optional<SplitName> parse_split(std::string_view file) {
    constexpr std::string_view kTail = "-00000-of-00000.gguf";
    if (file.size() <= kTail.size() || !ends_with_gguf(file)) return std::nullopt;
    std::string_view t = file.substr(file.size() - kTail.size());
    if (t[0] != '-' || t.substr(6, 4) != "-of-") return std::nullopt;
    SplitName s;
    auto digits = [](std::string_view d, int& v) {
        if (!std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; })) return false;
        return std::from_chars(d.data(), d.data() + d.size(), v).ec == std::errc();
    };
    if (!digits(t.substr(1, 5), s.index) || !digits(t.substr(10, 5), s.count)) return std::nullopt;
    if (s.index < 1 || s.count < 1 || s.index > s.count) return std::nullopt;
    s.prefix = std::string(file.substr(0, file.size() - kTail.size()));
    return s;
}

std::string split_file_name(std::string_view prefix, int index, int count) {
    return fmt::format("{}-{:05d}-of-{:05d}.gguf", prefix, index, count);
}

}  // namespace eh::model
