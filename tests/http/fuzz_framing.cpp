// libFuzzer target: arbitrary bytes through the request gate's parsers: the
// head, the chunked decoder (fed in pieces whose sizes come from the input),
// the inflater and the browser guards.
//   ./fuzz_framing -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "framing.hpp"
#include "request_guard.hpp"

using namespace eh::http;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const size_t step = 1 + data[0] % 64;
    std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
    FramingLimits limits;
    limits.max_body_bytes = 1 << 16;
    limits.max_head_bytes = 1 << 14;

    size_t end = in.find("\r\n\r\n");
    std::string_view head = in.substr(0, end);
    std::string_view rest = end == std::string_view::npos ? std::string_view() : in.substr(end + 4);
    RequestHead h;
    FramingError err;
    if (parse_head(head, limits, h, err)) (void)canonical_request(h, rest.substr(0, 64));
    host_allowed(head, "127.0.0.1", {"a.test"});
    local_origin(head);
    cross_site_form_post(head, true);

    ChunkedDecoder dec(limits);
    std::string out;
    for (size_t pos = 0; pos < rest.size();) {
        size_t used = 0;
        auto st = dec.feed(rest.substr(pos, step), used, out, err);
        if (st != ChunkedDecoder::Status::NeedMore) break;
        if (used == 0) break;
        pos += used;
    }
    std::string inflated;
    inflate_body(rest, data[0] & 1 ? Coding::Gzip : Coding::Deflate, limits.max_body_bytes, inflated, err);
    return 0;
}
