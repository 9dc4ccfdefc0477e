// libFuzzer target: arbitrary bytes through every JSON request parser of the
// HTTP API (/execute, /v1/completions, /v1/chat/completions, /tokenize,
// /detokenize, /cancel). The first byte picks the parser; the rest is the
// body. A parser may only answer with eh::Error (the 400 the server sends);
// any other exception, a crash or a sanitizer report is a bug. A first byte
// of 0xFF instead runs a chat message through ChatLiterals: marked and put
// back it must be the same bytes, and any rendered text's spans must lie in
// it, sorted. Built only with EH_ENABLE_FUZZERS=ON (clang).
//   build-fuzz/tests/http/fuzz_requests tests/http/fuzz_requests_seeds -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "eh/service/chat_prompt.hpp"
#include "parse/native_request.hpp"
#include "parse/openai_request.hpp"

namespace {

void check_literals(std::string_view text) {
    static const eh::service::ChatLiterals lit({"</s>", "<s>", "<|im_start|>", "<|im_end|>", "<"});
    if (lit.unmark(lit.mark(text)).text != text) __builtin_trap();
    auto p = lit.unmark(text);  // as if a template had written these bytes
    size_t end = 0;
    for (const auto& s : p.literal) {
        if (s.begin < end || s.end <= s.begin || s.end > p.text.size()) __builtin_trap();
        end = s.end;
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
    eh::service::RequestLimits limits;
    limits.max_prompt_chars = 4096;  // keeps each input cheap; the rules are the same
    // Images are decoded (host/image) under small limits, so no input costs much.
    limits.images.max_bytes = 1 << 16;
    limits.images.max_side = 256;
    limits.images.max_pixels = 1 << 14;
    if (data[0] == 0xFF) {
        check_literals(body);
        return 0;
    }
    try {
        switch (data[0] % 6) {
        case 0: (void)eh::http::parse_execute_request(body, limits); break;
        case 1: (void)eh::http::parse_openai_request(body, false, limits); break;
        case 2: (void)eh::http::parse_openai_request(body, true, limits); break;
        case 3: (void)eh::http::parse_tokenize_request(body, limits); break;
        case 4: (void)eh::http::parse_detokenize_request(body, 50000, limits); break;
        default: (void)eh::http::parse_cancel_request(body, limits); break;
        }
    } catch (const eh::Error&) {
        // The clear, stable rejection: expected for most inputs.
    }
    return 0;
}
