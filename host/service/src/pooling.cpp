#include "eh/service/pooling.hpp"

#include <fmt/format.h>
#include <openssl/evp.h>

#include <bit>
#include <cmath>
#include <cstring>

#include "eh/error.hpp"

namespace eh::service {

const char* const kQwen3RerankTemplate =
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n<Instruct>: Given a "
    "web search query, retrieve relevant passages that answer the query\n<Query>: {query}\n<Document>: "
    "{document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";

const char* pooling_mode_name(PoolingMode m) {
    switch (m) {
    case PoolingMode::Embedding: return "embedding";
    case PoolingMode::Rerank: return "rerank";
    case PoolingMode::None: break;
    }
    return "none";
}

std::vector<float> l2_normalized(std::span<const float> v) {
    double sum = 0;
    for (float x : v) sum += double(x) * double(x);
    std::vector<float> out(v.begin(), v.end());
    if (sum > 0) {
        const double inv = 1.0 / std::sqrt(sum);
        for (float& x : out) x = float(double(x) * inv);
    }
    return out;
}

double rerank_score(const PoolingSpec& spec, std::span<const float> hidden) {
    if (spec.rerank_head.size() != hidden.size())
        throw Error(Code::Internal, fmt::format("the rerank head has {} values but the hidden state {}",
                                                spec.rerank_head.size(), hidden.size()));
    double dot = 0;
    for (size_t i = 0; i < hidden.size(); ++i) dot += double(spec.rerank_head[i]) * double(hidden[i]);
    return 1.0 / (1.0 + std::exp(-dot));
}

std::string render_rerank(std::string_view tmpl, std::string_view query, std::string_view document,
                          std::vector<TextSpan>& literal) {
    std::string out;
    literal.clear();
    size_t at = 0;
    while (at < tmpl.size()) {
        const size_t q = tmpl.find("{query}", at), d = tmpl.find("{document}", at);
        const size_t next = std::min(q, d);
        if (next == std::string_view::npos) {
            out.append(tmpl.substr(at));
            break;
        }
        out.append(tmpl.substr(at, next - at));
        const std::string_view text = next == q ? query : document;
        literal.push_back({out.size(), out.size() + text.size()});
        out.append(text);
        at = next + (next == q ? 7 : 10);
    }
    return out;
}

std::string base64_floats(std::span<const float> v) {
    std::string bytes(v.size() * 4, '\0');
    for (size_t i = 0; i < v.size(); ++i) {
        uint32_t u = std::bit_cast<uint32_t>(v[i]);
        for (int b = 0; b < 4; ++b) bytes[i * 4 + size_t(b)] = char((u >> (8 * b)) & 0xff);
    }
    std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
    const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                  reinterpret_cast<const unsigned char*>(bytes.data()), int(bytes.size()));
    out.resize(size_t(n));
    return out;
}

}  // namespace eh::service
