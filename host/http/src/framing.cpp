#include "framing.hpp"

#include <zlib.h>

#include <algorithm>
#include <cctype>

namespace eh::http {
namespace {

constexpr size_t kMaxTargetBytes = 8192;  // httplib's own URI limit (414 past it)
constexpr size_t kMaxLineBytes = 8192;    // one header line (431 past it)
constexpr size_t kMaxChunkLine = 4096;    // a chunk-size line with its extensions

std::string lower(std::string_view s) {
    std::string r(s);
    for (auto& c : r) c = char(std::tolower(static_cast<unsigned char>(c)));
    return r;
}

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

bool is_tchar(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool is_token(std::string_view s) { return !s.empty() && std::all_of(s.begin(), s.end(), is_tchar); }

// Comma-separated list elements, trimmed, empty ones dropped.
std::vector<std::string> list_items(std::string_view v) {
    std::vector<std::string> out;
    size_t pos = 0;
    while (pos <= v.size()) {
        size_t c = v.find(',', pos);
        std::string_view item = trim(v.substr(pos, c == std::string_view::npos ? std::string_view::npos : c - pos));
        if (!item.empty()) out.push_back(lower(item));
        if (c == std::string_view::npos) break;
        pos = c + 1;
    }
    return out;
}

bool fail(FramingError& err, int status, std::string message) {
    err.status = status;
    err.message = std::move(message);
    return false;
}

// 1*DIGIT that fits in uint64; false otherwise.
bool parse_decimal(std::string_view s, uint64_t& out) {
    if (s.empty() || s.size() > 20) return false;
    uint64_t v = 0;
    for (char c : s) {
        if (c < '0' || c > '9') return false;
        uint64_t d = uint64_t(c - '0');
        if (v > (UINT64_MAX - d) / 10) return false;
        v = v * 10 + d;
    }
    out = v;
    return true;
}

}  // namespace

std::string RequestHead::header(std::string_view lower_name) const {
    for (const auto& [k, v] : headers)
        if (lower(k) == lower_name) return v;
    return "";
}

void RequestHead::drop_header(std::string_view lower_name) {
    std::erase_if(headers, [&](const auto& h) { return lower(h.first) == lower_name; });
}

bool parse_head(std::string_view head, const FramingLimits& limits, RequestHead& out, FramingError& err) {
    out = RequestHead{};
    if (head.size() > limits.max_head_bytes)
        return fail(err, 431, "the request head is larger than the limit of " + std::to_string(limits.max_head_bytes) + " bytes");
    std::vector<std::string_view> lines;
    for (size_t pos = 0; pos < head.size();) {
        size_t nl = head.find('\n', pos);
        std::string_view line = head.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        lines.push_back(line);
        if (nl == std::string_view::npos) break;
        pos = nl + 1;
    }
    if (lines.empty() || lines[0].empty()) return fail(err, 400, "empty request line");
    for (auto line : lines) {
        if (line.size() > kMaxLineBytes)
            return fail(err, 431, "a request header line is longer than " + std::to_string(kMaxLineBytes) + " bytes");
        for (char c : line)
            if (c == '\0' || c == '\r') return fail(err, 400, "control character in the request head");
    }

    std::string_view rl = lines[0];
    size_t s1 = rl.find(' '), s2 = s1 == std::string_view::npos ? s1 : rl.find(' ', s1 + 1);
    if (s2 == std::string_view::npos || rl.find(' ', s2 + 1) != std::string_view::npos)
        return fail(err, 400, "malformed request line");
    out.method = std::string(rl.substr(0, s1));
    out.target = std::string(rl.substr(s1 + 1, s2 - s1 - 1));
    out.version = std::string(rl.substr(s2 + 1));
    if (!is_token(out.method)) return fail(err, 400, "malformed request method");
    if (out.target.empty()) return fail(err, 400, "empty request target");
    if (out.target.size() > kMaxTargetBytes)
        return fail(err, 414, "the request target is longer than " + std::to_string(kMaxTargetBytes) + " bytes");
    for (unsigned char c : out.target)
        if (c <= 0x20 || c == 0x7f) return fail(err, 400, "control character in the request target");
    if (out.version != "HTTP/1.1" && out.version != "HTTP/1.0")
        return fail(err, out.version.rfind("HTTP/", 0) == 0 ? 505 : 400, "unsupported HTTP version");

    std::vector<std::string> te, connection;
    bool have_length = false, have_te = false, have_ce = false;
    int hosts = 0;
    for (size_t i = 1; i < lines.size(); ++i) {
        std::string_view line = lines[i];
        if (line.empty()) continue;
        if (line.front() == ' ' || line.front() == '\t') return fail(err, 400, "obsolete header line folding");
        size_t colon = line.find(':');
        if (colon == std::string_view::npos) return fail(err, 400, "header line without a colon");
        std::string_view name = line.substr(0, colon);
        if (!is_token(name)) return fail(err, 400, "malformed header name");
        std::string_view value = trim(line.substr(colon + 1));
        const std::string key = lower(name);
        if (key == "content-length") {
            // A list of identical values is one length (RFC 9110 8.6);
            // anything else is a conflict.
            for (const auto& item : list_items(value)) {
                uint64_t n = 0;
                if (!parse_decimal(item, n)) return fail(err, 400, "Content-Length is not a decimal number that fits in 64 bits");
                if (have_length && n != out.content_length) return fail(err, 400, "conflicting Content-Length values");
                out.content_length = n;
                have_length = true;
            }
            if (list_items(value).empty()) return fail(err, 400, "empty Content-Length");
            continue;
        }
        if (key == "transfer-encoding") {
            for (auto& item : list_items(value)) te.push_back(item);
            have_te = true;
            continue;
        }
        if (key == "content-encoding") {
            auto items = list_items(value);
            if (have_ce || items.size() > 1) return fail(err, 415, "only one Content-Encoding (gzip or deflate) is supported");
            have_ce = true;
            std::string c = items.empty() ? "identity" : items[0];
            if (c == "gzip" || c == "x-gzip") out.coding = Coding::Gzip;
            else if (c == "deflate") out.coding = Coding::Deflate;
            else if (c != "identity") return fail(err, 415, "unsupported Content-Encoding (gzip and deflate are)");
            continue;
        }
        if (key == "expect") {
            if (lower(value) != "100-continue") return fail(err, 417, "unsupported Expect");
            out.expect_continue = true;
            continue;
        }
        if (key == "range" || key == "if-range" || key == "trailer") continue;  // no route serves ranges
        if (key == "host") ++hosts;
        if (key == "connection")
            for (auto& item : list_items(value)) connection.push_back(item);
        out.headers.emplace_back(std::string(name), std::string(value));
    }
    if (out.version == "HTTP/1.1" && hosts != 1)
        return fail(err, 400, hosts ? "more than one Host header" : "missing Host header");
    if (hosts > 1) return fail(err, 400, "more than one Host header");
    if (have_te) {
        if (out.version == "HTTP/1.0") return fail(err, 400, "Transfer-Encoding in an HTTP/1.0 request");
        if (te != std::vector<std::string>{"chunked"})
            return fail(err, 400, "unsupported Transfer-Encoding (only chunked is accepted)");
        if (have_length) return fail(err, 400, "both Content-Length and Transfer-Encoding");
        out.chunked = true;
    }
    if (!out.chunked && out.content_length > limits.max_body_bytes)
        return fail(err, 413, "the request body is larger than the limit of " + std::to_string(limits.max_body_bytes) + " bytes");
    const bool has_close = std::find(connection.begin(), connection.end(), "close") != connection.end();
    const bool has_keep = std::find(connection.begin(), connection.end(), "keep-alive") != connection.end();
    out.wants_close = has_close || (out.version == "HTTP/1.0" && !has_keep);
    return true;
}

ChunkedDecoder::Status ChunkedDecoder::fail(FramingError& err, int status, std::string message) {
    err.status = status;
    err.message = std::move(message);
    return Status::Failed;
}

ChunkedDecoder::Status ChunkedDecoder::feed(std::string_view in, size_t& consumed, std::string& out, FramingError& err) {
    consumed = 0;
    while (consumed < in.size()) {
        if (state_ == State::Data) {
            size_t n = size_t(std::min<uint64_t>(remaining_, in.size() - consumed));
            out.append(in.data() + consumed, n);
            consumed += n;
            remaining_ -= n;
            if (remaining_ == 0) state_ = State::DataEnd;
            continue;
        }
        // Line states: collect up to LF.
        char c = in[consumed++];
        if (c != '\n') {
            line_.push_back(c);
            const size_t cap = state_ == State::Trailer ? limits_.max_trailer_bytes : kMaxChunkLine;
            if (line_.size() > cap)
                return state_ == State::Trailer ? fail(err, 431, "chunked trailers are larger than " + std::to_string(cap) + " bytes")
                                                : fail(err, 400, "chunk-size line too long");
            if (state_ == State::Trailer) ++trailer_bytes_;
            continue;
        }
        std::string line = std::move(line_);
        line_.clear();
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (state_ == State::DataEnd) {
            if (!line.empty()) return fail(err, 400, "chunk data longer than its size");
            state_ = State::Size;
            continue;
        }
        if (state_ == State::Trailer) {
            if (line.empty()) return Status::Done;
            if (trailer_bytes_ > limits_.max_trailer_bytes)
                return fail(err, 431, "chunked trailers are larger than " + std::to_string(limits_.max_trailer_bytes) + " bytes");
            if (line.find(':') == std::string::npos || line.front() == ' ' || line.front() == '\t')
                return fail(err, 400, "malformed chunked trailer");
            continue;
        }
        // State::Size: 1*HEXDIG [ BWS ";" extensions ]
        size_t digits = 0;
        uint64_t size = 0;
        while (digits < line.size() && std::isxdigit(static_cast<unsigned char>(line[digits]))) {
            if (digits == 15) return fail(err, 400, "chunk size too large");
            size = size * 16 + uint64_t(std::isdigit(static_cast<unsigned char>(line[digits]))
                                            ? line[digits] - '0'
                                            : std::tolower(static_cast<unsigned char>(line[digits])) - 'a' + 10);
            ++digits;
        }
        std::string_view rest = trim(std::string_view(line).substr(digits));
        if (digits == 0 || (!rest.empty() && rest.front() != ';')) return fail(err, 400, "malformed chunk size");
        if (size > limits_.max_body_bytes || out.size() + size > limits_.max_body_bytes)
            return fail(err, 413, "the request body is larger than the limit of " + std::to_string(limits_.max_body_bytes) + " bytes");
        if (size == 0) {
            state_ = State::Trailer;
        } else {
            remaining_ = size;
            state_ = State::Data;
        }
    }
    return Status::NeedMore;
}

bool inflate_body(std::string_view in, Coding coding, size_t max_out, std::string& out, FramingError& err) {
    out.clear();
    if (coding == Coding::Identity) {
        out.assign(in);
        return true;
    }
    z_stream z{};
    if (inflateInit2(&z, coding == Coding::Gzip ? 16 + MAX_WBITS : MAX_WBITS) != Z_OK)
        return fail(err, 500, "cannot start the decompressor");
    struct End {
        z_stream& z;
        ~End() { inflateEnd(&z); }
    } end{z};
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
    z.avail_in = uInt(in.size());
    char buf[16384];
    for (;;) {
        z.next_out = reinterpret_cast<Bytef*>(buf);
        z.avail_out = sizeof buf;
        int rc = inflate(&z, Z_NO_FLUSH);
        size_t got = sizeof buf - z.avail_out;
        if (out.size() + got > max_out)
            return fail(err, 413, "the request body is larger than the limit of " + std::to_string(max_out) + " bytes once decompressed");
        out.append(buf, got);
        if (rc == Z_STREAM_END) break;
        if (rc == Z_OK) continue;
        if (rc == Z_BUF_ERROR && z.avail_in == 0) return fail(err, 400, "the compressed body is truncated");
        return fail(err, 400, "the compressed body is corrupt");
    }
    if (z.avail_in != 0) return fail(err, 400, "data after the end of the compressed body");
    return true;
}

std::string canonical_request(const RequestHead& head, std::string_view body) {
    std::string r = head.method + " " + head.target + " " + head.version + "\r\n";
    for (const auto& [k, v] : head.headers) r += k + ": " + v + "\r\n";
    if (!body.empty() || head.method == "POST" || head.method == "PUT" || head.method == "PATCH")
        r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    r += "\r\n";
    r.append(body);
    return r;
}

}  // namespace eh::http
