// Unit tests of the request gate's pure parts: framing (fed in every split)
// and the browser guards (issue 26, items 6, 7 and 12).
#include <gtest/gtest.h>

#include "framing.hpp"
#include "request_guard.hpp"

namespace eh::http {
namespace {

TEST(Framing, ChunkedDecodesTheSameWhateverTheSplit) {
    const std::string wire = "4;x=y\r\nWiki\r\n5\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nA: b\r\n\r\nNEXT";
    for (size_t step = 1; step <= wire.size(); ++step) {
        SCOPED_TRACE(step);
        ChunkedDecoder d({});
        std::string out;
        FramingError err;
        size_t pos = 0;
        ChunkedDecoder::Status st = ChunkedDecoder::Status::NeedMore;
        while (st == ChunkedDecoder::Status::NeedMore && pos < wire.size()) {
            size_t used = 0;
            st = d.feed(std::string_view(wire).substr(pos, step), used, out, err);
            pos += used;
        }
        ASSERT_EQ(st, ChunkedDecoder::Status::Done) << err.message;
        EXPECT_EQ(out, "Wikipedia in\r\n\r\nchunks.");
        EXPECT_EQ(wire.substr(pos), "NEXT");  // the next pipelined request is left alone
    }
}

TEST(Framing, ChunkedStopsAtTheBodyLimitBeforeBuffering) {
    FramingLimits l;
    l.max_body_bytes = 10;
    ChunkedDecoder d(l);
    std::string out;
    FramingError err;
    size_t used = 0;
    EXPECT_EQ(d.feed("6\r\nabcdef\r\n5\r\n", used, out, err), ChunkedDecoder::Status::Failed);
    EXPECT_EQ(err.status, 413);
    EXPECT_EQ(out, "abcdef");
}

TEST(Framing, HeadKeepsOrdinaryHeadersAndDropsFramingOnes) {
    RequestHead h;
    FramingError err;
    ASSERT_TRUE(parse_head("POST /x?a=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nRange: bytes=0-1\r\nX-A:  b \r\n"
                           "Connection: keep-alive, close",
                           {}, h, err))
        << err.message;
    EXPECT_EQ(h.target, "/x?a=1");
    EXPECT_EQ(h.content_length, 3u);
    EXPECT_TRUE(h.wants_close);
    EXPECT_EQ(h.header("x-a"), "b");
    EXPECT_EQ(h.header("range"), "");
    EXPECT_EQ(canonical_request(h, "abc"),
              "POST /x?a=1 HTTP/1.1\r\nHost: h\r\nX-A: b\r\nConnection: keep-alive, close\r\nContent-Length: 3\r\n\r\nabc");
    ASSERT_TRUE(parse_head("GET / HTTP/1.0", {}, h, err));
    EXPECT_TRUE(h.wants_close);
}

TEST(RequestGuard, OnlyExactLocalOriginsAreTrusted) {
    for (const char* ok : {"http://localhost", "http://localhost:5173", "https://127.0.0.1:8443", "https://[::1]",
                           "http://[::1]:3000", "HTTP://LOCALHOST"})
        EXPECT_TRUE(local_origin(ok)) << ok;
    for (const char* bad : {"http://localhost:@evil.example", "http://localhost@evil.example", "http://localhost.evil.example",
                            "http://127.0.0.1.nip.io", "http://localhost/path", "http://localhost:80x", "file://localhost",
                            "null", "", "http://[::1", "http://evil.example#localhost"})
        EXPECT_FALSE(local_origin(bad)) << bad;
}

TEST(RequestGuard, HostMustBeAnAddressLocalhostTheBoundHostOrAllowed) {
    for (const char* ok : {"127.0.0.1", "127.0.0.1:8080", "localhost:8080", "[::1]:8080", "10.1.2.3", "LOCALHOST"})
        EXPECT_TRUE(host_allowed(ok, "127.0.0.1", {})) << ok;
    for (const char* bad : {"evil.example", "evil.example:8080", "127.0.0.1.nip.io", "", "localhost:x", "[::1"})
        EXPECT_FALSE(host_allowed(bad, "127.0.0.1", {})) << bad;
    EXPECT_TRUE(host_allowed("worker-3.lan:8080", "worker-3.lan", {}));
    EXPECT_TRUE(host_allowed("api.internal", "0.0.0.0", {"api.internal"}));
    EXPECT_TRUE(host_allowed("anything", "0.0.0.0", {"*"}));
}

TEST(RequestGuard, CrossSiteFormPostsAreRecognised) {
    EXPECT_TRUE(cross_site_form_post("text/plain", false));
    EXPECT_TRUE(cross_site_form_post("Text/Plain; charset=utf-8", false));
    EXPECT_TRUE(cross_site_form_post("multipart/form-data; boundary=x", false));
    EXPECT_TRUE(cross_site_form_post("application/x-www-form-urlencoded", true));
    EXPECT_FALSE(cross_site_form_post("application/x-www-form-urlencoded", false));  // curl -d
    EXPECT_FALSE(cross_site_form_post("application/json", true));
    EXPECT_FALSE(cross_site_form_post("", true));
}

}  // namespace
}  // namespace eh::http
