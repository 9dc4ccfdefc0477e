// libFuzzer target: arbitrary bytes as a chat template, compiled and (when
// it compiles) rendered with a small budget. Any crash, hang or sanitizer
// report is a bug: hostile templates must fail with eh::Error.
//   ./fuzz_chat_template -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "eh/error.hpp"
#include "eh/tokenizer/chat_template.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::string_view src(reinterpret_cast<const char*>(data), size);
    try {
        auto t = eh::tokenizer::ChatTemplate::compile(src);
        eh::tokenizer::ChatOptions o;
        o.max_steps = 20000;  // small, so one input stays fast
        o.max_output_bytes = 1 << 16;
        o.now = "2026-01-02 03:04:05";
        t->render(R"([{"role":"system","content":"s"},{"role":"user","content":"u"},{"role":"assistant","content":"a"}])", o);
    } catch (const eh::Error&) {
    }
    return 0;
}
