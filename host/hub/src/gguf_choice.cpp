#include "eh/hub/gguf_choice.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>

#include <fmt/format.h>

#include "eh/error.hpp"

namespace eh::hub {
namespace {

bool ends_with_ci(std::string_view s, std::string_view suffix) {
    if (s.size() < suffix.size()) return false;
    for (size_t i = 0; i < suffix.size(); ++i)
        if (std::tolower((unsigned char)s[s.size() - suffix.size() + i]) != std::tolower((unsigned char)suffix[i]))
            return false;
    return true;
}

std::string upper(std::string_view s) {
    std::string out(s);
    std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return char(std::toupper(c)); });
    return out;
}

std::string_view basename(std::string_view f) {
    size_t slash = f.rfind('/');
    return slash == std::string_view::npos ? f : f.substr(slash + 1);
}

// The name without ".gguf" and without a split suffix.
std::string stem(std::string_view file) {
    if (auto s = parse_split(file)) return s->prefix;
    return std::string(file.substr(0, file.size() - 5));
}

// `quant` appears in `name` between delimiters ('-', '.', '_' or '/' before;
// '-', '.' or '/' after, since '_' continues a quant name: Q4_K vs Q4_K_M).
bool has_token(const std::string& name, const std::string& quant) {
    std::string n = upper(name), q = upper(quant);
    for (size_t at = n.find(q); at != std::string::npos; at = n.find(q, at + 1)) {
        bool before = at == 0 || std::string_view("-._/").find(n[at - 1]) != std::string_view::npos;
        size_t end = at + q.size();
        bool after = end == n.size() || std::string_view("-./").find(n[end]) != std::string_view::npos;
        if (before && after) return true;
    }
    return false;
}

std::string list_choices(const std::vector<std::string>& files) {
    std::string out;
    for (const auto& f : files) out += fmt::format("\n  {:<10} {}", quant_label(f), f);
    return out;
}

}  // namespace

std::vector<std::string> shard_set(const std::string& file) {
    auto s = parse_split(file);
    if (!s) return {file};
    if (s->count > kMaxShards)
        throw Error(Code::InvalidRequest, fmt::format("'{}' is one of {} shards; at most {} are fetched", file,
                                                      s->count, kMaxShards));
    std::vector<std::string> out;
    for (int i = 1; i <= s->count; ++i) out.push_back(model::split_file_name(s->prefix, i, s->count));
    return out;
}

std::string quant_label(std::string_view file) {
    std::string st = ends_with_ci(file, ".gguf") ? stem(basename(file)) : std::string(basename(file));
    size_t cut = st.find_last_of("-.");
    return cut == std::string::npos ? st : st.substr(cut + 1);
}

std::optional<std::string> choose_mmproj(const std::vector<std::string>& files, const std::string& model) {
    const size_t slash = model.rfind('/');
    const std::string dir = slash == std::string::npos ? std::string() : model.substr(0, slash + 1);
    std::vector<std::string> found;
    for (const auto& f : files) {
        if (!ends_with_ci(f, ".gguf") || f.size() <= dir.size() || f.compare(0, dir.size(), dir) != 0) continue;
        const std::string_view name = std::string_view(f).substr(dir.size());
        if (name.find('/') != std::string_view::npos || upper(name).rfind("MMPROJ", 0) != 0) continue;
        found.push_back(f);
    }
    if (found.empty()) return std::nullopt;
    std::sort(found.begin(), found.end());
    // The converter's default type first (--mmproj writes F16 unless told).
    for (const char* want : {"F16", "BF16", "F32", "Q8_0"})
        for (const auto& f : found)
            if (upper(quant_label(f)) == want) return f;
    return found.front();
}

std::string choose_gguf(const std::vector<std::string>& files, const std::string& quant, const std::string& repo_shown) {
    // Candidates: GGUF files and split sets (by their first shard).
    std::vector<std::string> ggufs;
    for (const auto& f : files) {
        if (!ends_with_ci(f, ".gguf")) continue;
        if (upper(basename(f)).rfind("MMPROJ", 0) == 0) continue;
        auto s = parse_split(f);
        if (s && s->index != 1) continue;
        ggufs.push_back(f);
    }
    std::sort(ggufs.begin(), ggufs.end());
    if (ggufs.empty())
        throw Error(Code::NotFound, repo_shown + " has no GGUF file" +
                                        (files.empty() ? std::string() : " (it has " + std::to_string(files.size()) +
                                                                             " other files)"));
    auto matching = [&](const std::string& q) {
        std::vector<std::string> m;
        for (const auto& f : ggufs)
            if (has_token(stem(f), q)) m.push_back(f);
        return m;
    };
    if (quant.empty()) {
        if (ggufs.size() == 1) return ggufs.front();
        auto m = matching("Q4_K_M");
        if (m.size() == 1) return m.front();
        throw Error(Code::InvalidRequest, fmt::format("{} has {} GGUF files; name one as {}:QUANT. Choices:{}",
                                                      repo_shown, ggufs.size(), repo_shown, list_choices(ggufs)));
    }
    auto m = matching(quant);
    if (m.size() == 1) return m.front();
    if (m.empty())
        throw Error(Code::NotFound, fmt::format("{} has no GGUF file of quantization '{}'. Choices:{}", repo_shown,
                                                quant, list_choices(ggufs)));
    throw Error(Code::InvalidRequest, fmt::format("{}:{} is ambiguous: {} files match; use hf://{}/FILE. Matches:{}",
                                                  repo_shown, quant, m.size(), repo_shown, list_choices(m)));
}

}  // namespace eh::hub
