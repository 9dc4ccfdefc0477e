#include "eh/hub/ref.hpp"

#include <filesystem>
#include <optional>

#include "eh/error.hpp"

namespace eh::hub {
namespace {

bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
           c == '.';
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
    return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

[[noreturn]] void bad(std::string_view text, const std::string& why) {
    std::string shown(text.substr(0, 200));
    for (char& c : shown)
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';  // messages stay one printable line
    throw Error(Code::InvalidRequest, "model reference '" + shown + (text.size() > 200 ? "...'" : "'") + ": " + why);
}

// Text that can only be a path: never read as ORG/REPO.
bool path_syntax(std::string_view t) {
    return starts_with(t, "/") || starts_with(t, "./") || starts_with(t, "../") || starts_with(t, "~/") || t == "." ||
           t == ".." || ends_with(t, ".gguf") || ends_with(t, ".safetensors");
}

// REPO@REV -> REPO, revision REV.
void split_revision(std::string_view text, ModelRef& r) {
    size_t at = r.repo.find('@');
    if (at == std::string::npos) return;
    r.revision = r.repo.substr(at + 1);
    r.repo.resize(at);
    if (auto p = revision_problem(r.revision); !p.empty()) bad(text, p);
}

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// %XX escapes to bytes; nullopt for a '%' that does not start one.
std::optional<std::string> percent_decode(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] != '%') {
            out.push_back(s[i]);
            continue;
        }
        int hi = i + 2 < s.size() ? hex_value(s[i + 1]) : -1, lo = hi < 0 ? -1 : hex_value(s[i + 2]);
        if (lo < 0) return std::nullopt;
        out.push_back(char(hi * 16 + lo));
        i += 2;
    }
    return out;
}

}  // namespace

std::string repo_part_problem(std::string_view part) {
    if (part.empty()) return "an empty organisation or repository name";
    if (part.size() > kMaxRepoPartBytes)
        return "a name longer than " + std::to_string(kMaxRepoPartBytes) + " characters";
    for (char c : part)
        if (!name_char(c)) return "a name may hold only letters, digits, '-', '_' and '.'";
    if (part.front() == '-' || part.front() == '.' || part.back() == '-' || part.back() == '.')
        return "a name may not start or end with '-' or '.'";
    if (part.find("--") != std::string_view::npos || part.find("..") != std::string_view::npos)
        return "a name may not contain '--' or '..'";
    return "";
}

std::string repo_file_problem(std::string_view file) {
    if (file.empty()) return "no file named after ORG/REPO/";
    size_t start = 0;
    while (start <= file.size()) {
        size_t end = file.find('/', start);
        if (end == std::string_view::npos) end = file.size();
        std::string_view seg = file.substr(start, end - start);
        if (seg.empty()) return "an empty path segment in the file name";
        if (seg == "." || seg == "..") return "'.' and '..' are not allowed in the file name";
        start = end + 1;
    }
    for (unsigned char c : file)
        if (c < 0x20 || c == 0x7f || c == '\\') return "control characters and '\\' are not allowed in the file name";
    return "";
}

std::string revision_problem(std::string_view rev) {
    if (rev.empty()) return "an empty revision after '@'";
    if (rev.size() > kMaxRevisionBytes) return "a revision longer than " + std::to_string(kMaxRevisionBytes) + " characters";
    for (char c : rev)
        if (!name_char(c)) return "a revision may hold only letters, digits, '-', '_' and '.' (use the commit hash for others)";
    if (rev.find("..") != std::string_view::npos || rev.front() == '.') return "a revision may not start with '.' or hold '..'";
    return "";
}

std::string ModelRef::display() const {
    std::string rev = revision == "main" ? "" : "@" + revision;
    switch (kind) {
    case Kind::LocalPath: return path;
    case Kind::HubFile: {
        std::string shown;  // re-encoded where parse_ref would decode, so it parses back to this file
        for (char c : file) shown += c == '%' ? std::string("%25") : std::string(1, c);
        return "hf://" + repo_id() + rev + "/" + shown;
    }
    case Kind::HubRepo: return repo_id() + rev + (quant.empty() ? "" : ":" + quant);
    }
    return path;
}

ModelRef parse_ref(std::string_view text, const std::function<bool(const std::string&)>& exists) {
    if (text.empty()) bad(text, "empty");
    if (text.size() > kMaxRefBytes) bad(text, "longer than " + std::to_string(kMaxRefBytes) + " bytes");
    if (text.find('\0') != std::string_view::npos) bad(text, "contains a NUL byte");
    ModelRef r;

    if (starts_with(text, "hf://")) {
        std::string_view rest = text.substr(5);
        size_t a = rest.find('/');
        size_t b = a == std::string_view::npos ? a : rest.find('/', a + 1);
        if (b == std::string_view::npos) bad(text, "expected hf://ORG/REPO/FILE");
        r.kind = ModelRef::Kind::HubFile;
        r.org = rest.substr(0, a);
        r.repo = rest.substr(a + 1, b - a - 1);
        split_revision(text, r);
        for (const auto* part : {&r.org, &r.repo})
            if (auto p = repo_part_problem(*part); !p.empty()) bad(text, p);
        // FILE is URL text: decoded first, so the segment rules see what the
        // hub would (%2e%2e is '..', %2F a separator).
        auto file = percent_decode(rest.substr(b + 1));
        if (!file) bad(text, "a '%' in the file name must start an escape such as %20 (write '%' itself as %25)");
        r.file = std::move(*file);
        if (auto p = repo_file_problem(r.file); !p.empty()) bad(text, p);
        return r;
    }

    std::string s(text);
    if (path_syntax(text) || (exists && exists(s))) {
        r.path = s;
        return r;
    }
    // ORG/REPO[:QUANT]: exactly one '/', names by the hub's rules.
    size_t slash = text.find('/');
    if (slash == std::string_view::npos || text.find('/', slash + 1) != std::string_view::npos) {
        r.path = s;  // a relative path that does not exist: opening it reports that
        return r;
    }
    std::string_view org = text.substr(0, slash), repo = text.substr(slash + 1), quant;
    if (size_t colon = repo.find(':'); colon != std::string_view::npos) {
        quant = repo.substr(colon + 1);
        repo = repo.substr(0, colon);
        if (quant.empty()) bad(text, "empty quantization after ':'");
        if (quant.size() > kMaxQuantBytes)
            bad(text, "quantization longer than " + std::to_string(kMaxQuantBytes) + " characters");
        for (char c : quant)
            if (!name_char(c) || c == '.') bad(text, "a quantization may hold only letters, digits, '-' and '_'");
    }
    ModelRef hub;
    hub.kind = ModelRef::Kind::HubRepo;
    hub.org = org;
    hub.repo = repo;
    hub.quant = quant;
    bool has_rev = repo.find('@') != std::string_view::npos;
    if (has_rev) split_revision(text, hub);
    if (repo_part_problem(hub.org).empty() && repo_part_problem(hub.repo).empty()) return hub;
    if (!quant.empty() || has_rev) {  // only hub references carry ':QUANT' or '@REV'
        std::string why = repo_part_problem(hub.org);
        bad(text, why.empty() ? repo_part_problem(hub.repo) : why);
    }
    r.path = s;
    return r;
}

}  // namespace eh::hub
