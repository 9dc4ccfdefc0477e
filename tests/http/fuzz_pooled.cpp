// libFuzzer target: arbitrary bytes through the embeddings and rerank request
// parsers (POST /v1/embeddings, /v1/rerank). A parser may only answer with
// eh::Error (the 400 the server sends); any other exception, a crash or a
// sanitizer report is a bug. An accepted request must hold together: between
// one and kMaxPooledInputs inputs (documents), none empty, token ids never
// negative. Built only with EH_ENABLE_FUZZERS=ON (clang).
//   build-fuzz/bin/fuzz_pooled tests/http/fuzz_pooled_seeds -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "eh/service/pooling.hpp"
#include "parse/pooled_request.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view body(reinterpret_cast<const char*>(data), size);
    eh::service::RequestLimits limits;
    limits.max_prompt_chars = 4096;  // keeps each input cheap; the rules are the same
    try {
        const eh::http::EmbeddingsRequest r = eh::http::parse_embeddings_request(body, limits);
        if (r.inputs.empty() || r.inputs.size() > eh::service::kMaxPooledInputs) std::abort();
        for (const auto& in : r.inputs) {
            if (in.is_tokens ? in.tokens.empty() : in.text.empty()) std::abort();
            for (int32_t t : in.tokens)
                if (t < 0) std::abort();
        }
        if (r.dimensions && *r.dimensions == 0) std::abort();
    } catch (const eh::Error&) {
    }
    try {
        const eh::http::RerankRequest r = eh::http::parse_rerank_request(body, limits);
        if (r.query.empty() || r.documents.empty() || r.documents.size() > eh::service::kMaxPooledInputs) std::abort();
        for (const auto& d : r.documents)
            if (d.empty()) std::abort();
        if (r.top_n && *r.top_n == 0) std::abort();
    } catch (const eh::Error&) {
    }
    return 0;
}
