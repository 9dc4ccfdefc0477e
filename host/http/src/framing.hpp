// HTTP/1.1 request framing, checked before cpp-httplib sees a byte.
//
// The connection loop (connection.cpp) reads one request at a time with
// these pure functions: the head is parsed and its framing validated
// (Content-Length, Transfer-Encoding, Content-Encoding), the body is read,
// de-chunked and inflated under the body limit, and the request is handed to
// httplib in one canonical form: Content-Length framing, no transfer or
// content coding, no Range. Anything ambiguous is refused with a status and
// a sentence, never guessed at (request smuggling lives in those guesses).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace eh::http {

struct FramingLimits {
    size_t max_head_bytes = 64 * 1024;    // request line + headers (431 past it)
    size_t max_body_bytes = 1 << 20;      // after de-chunking and inflating (413 past it)
    size_t max_trailer_bytes = 8 * 1024;  // chunked trailers (431 past it)
};

// A refusal: the HTTP status and the message for the error envelope.
struct FramingError {
    int status = 400;
    std::string message;
};

enum class Coding { Identity, Gzip, Deflate };

struct RequestHead {
    std::string method, target, version;  // version: "HTTP/1.1" or "HTTP/1.0"
    std::vector<std::pair<std::string, std::string>> headers;  // as sent, minus framing ones
    bool chunked = false;
    uint64_t content_length = 0;  // when not chunked
    Coding coding = Coding::Identity;
    bool expect_continue = false;
    bool wants_close = false;     // Connection: close, or HTTP/1.0 without keep-alive
    std::string header(std::string_view lower_name) const;  // first value, "" if none
    void drop_header(std::string_view lower_name);          // every header of that name
};

// Parses a head (everything before the blank line, without it). On failure
// returns false and fills `err`.
bool parse_head(std::string_view head, const FramingLimits& limits, RequestHead& out, FramingError& err);

// Incremental chunked-body decoder (RFC 9112 section 7.1): chunk sizes in
// hex (at most 15 digits), extensions ignored, trailers read and dropped.
class ChunkedDecoder {
public:
    enum class Status { NeedMore, Done, Failed };
    explicit ChunkedDecoder(const FramingLimits& limits) : limits_(limits) {}
    // Consumes from `in` (sets `consumed`), appends payload to `out`.
    Status feed(std::string_view in, size_t& consumed, std::string& out, FramingError& err);

private:
    enum class State { Size, Data, DataEnd, Trailer };
    Status fail(FramingError& err, int status, std::string message);
    FramingLimits limits_;
    State state_ = State::Size;
    std::string line_;
    uint64_t remaining_ = 0;
    size_t trailer_bytes_ = 0;
};

// Inflates a gzip or deflate (zlib) body; false with `err` (413 past the
// limit, 400 for corrupt data).
bool inflate_body(std::string_view in, Coding coding, size_t max_out, std::string& out, FramingError& err);

// The request as httplib will read it: the head's headers, Content-Length
// framing for `body`, without Range / If-Range / Expect.
std::string canonical_request(const RequestHead& head, std::string_view body);

}  // namespace eh::http
