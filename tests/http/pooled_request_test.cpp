// The /v1/embeddings and /v1/rerank bodies (parse/pooled_request.cpp) and the
// arithmetic around their answers (eh/service/pooling.hpp): every shape the
// APIs allow, every refusal with its message.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "eh/service/pooling.hpp"
#include "parse/pooled_request.hpp"

using eh::http::parse_embeddings_request;
using eh::http::parse_rerank_request;
using eh::service::RequestError;
using eh::service::RequestLimits;

namespace {

// The RequestError's message and field for `body`, or "accepted".
template <class F>
std::pair<std::string, std::string> refusal(F&& parse, const std::string& body) {
    try {
        parse(body, RequestLimits{});
    } catch (const RequestError& e) {
        return {e.what(), e.field()};
    }
    return {"accepted", ""};
}

auto emb = [](const std::string& b, const RequestLimits& l) { return parse_embeddings_request(b, l); };
auto rer = [](const std::string& b, const RequestLimits& l) { return parse_rerank_request(b, l); };

}  // namespace

TEST(EmbeddingsRequest, EveryInputShape) {
    auto r = parse_embeddings_request(R"({"input":"hello","model":"m"})", {});
    ASSERT_EQ(r.inputs.size(), 1u);
    EXPECT_EQ(r.inputs[0].text, "hello");
    EXPECT_FALSE(r.inputs[0].is_tokens);
    EXPECT_TRUE(r.inputs[0].add_special);
    EXPECT_FALSE(r.inputs[0].parse_special);  // an input's control-token text is text
    EXPECT_EQ(r.model, "m");
    EXPECT_FALSE(r.base64);

    r = parse_embeddings_request(R"({"input":["a","b"],"encoding_format":"base64"})", {});
    ASSERT_EQ(r.inputs.size(), 2u);
    EXPECT_EQ(r.inputs[1].text, "b");
    EXPECT_TRUE(r.base64);

    r = parse_embeddings_request(R"({"input":[1,2,3]})", {});  // one input as token ids
    ASSERT_EQ(r.inputs.size(), 1u);
    EXPECT_TRUE(r.inputs[0].is_tokens);
    EXPECT_EQ(r.inputs[0].tokens, (std::vector<int32_t>{1, 2, 3}));

    r = parse_embeddings_request(R"({"input":[[1,2],[3]],"dimensions":8,"user":"u","encoding_format":null})", {});
    ASSERT_EQ(r.inputs.size(), 2u);
    EXPECT_EQ(r.inputs[1].tokens, (std::vector<int32_t>{3}));
    EXPECT_EQ(r.dimensions, 8u);

    r = parse_embeddings_request(R"({"input":["text",[5,6]]})", {});  // mixed: each element its own kind
    EXPECT_FALSE(r.inputs[0].is_tokens);
    EXPECT_TRUE(r.inputs[1].is_tokens);
}

TEST(EmbeddingsRequest, RefusalsNameTheField) {
    using P = std::pair<std::string, std::string>;
    EXPECT_EQ(refusal(emb, R"({})"), (P{"'input' is required", "input"}));
    EXPECT_EQ(refusal(emb, R"({"input":""})"), (P{"'input' must not be an empty string", "input"}));
    EXPECT_EQ(refusal(emb, R"({"input":[]})"), (P{"'input' must not be an empty array", "input"}));
    EXPECT_EQ(refusal(emb, R"({"input":["a",""]})"), (P{"'input[1]' must not be an empty string", "input"}));
    EXPECT_EQ(refusal(emb, R"({"input":[[]]})"), (P{"'input[0]' is an empty array of token ids", "input"}));
    EXPECT_EQ(refusal(emb, R"({"input":[1,-2]})"), (P{"'input[1]' is not a token id (0..2147483647)", "input"}));
    EXPECT_EQ(refusal(emb, R"({"input":[1,"a"]})"), (P{"'input[1]' must be a token id (an integer), not string", "input"}));
    EXPECT_EQ(refusal(emb, R"({"input":[[1],{"a":1}]})"),
              (P{"'input[1]' must be a string or an array of token ids, not object", "input"}));
    EXPECT_EQ(refusal(emb, R"({"input":3})"),
              (P{"'input' must be a string or an array (of strings, of token ids, or of arrays of token ids), not "
                 "integer",
                 "input"}));
    EXPECT_EQ(refusal(emb, R"({"input":"a","encoding_format":"int8"})"),
              (P{"'encoding_format' must be \"float\" or \"base64\"", "encoding_format"}));
    EXPECT_EQ(refusal(emb, R"({"input":"a","dimensions":0})").second, "dimensions");
    EXPECT_EQ(refusal(emb, R"({"input":"a","truncate":true})"), (P{"unknown field 'truncate'", "truncate"}));
    EXPECT_EQ(refusal(emb, R"({"input":"a\u0000b"})").second, "input");
    std::string many = R"({"input":[)";
    for (int i = 0; i < 2049; ++i) many += std::string(i ? "," : "") + "\"x\"";
    many += "]}";
    EXPECT_EQ(refusal(emb, many), (P{"'input' holds more than 2048 inputs; the limit is 2048 per request", "input"}));
}

TEST(RerankRequest, ShapesAndRefusals) {
    auto r = parse_rerank_request(
        R"({"model":"m","query":"q","documents":["a",{"text":"b"}],"top_n":1,"return_documents":true})", {});
    EXPECT_EQ(r.query, "q");
    EXPECT_EQ(r.documents, (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(r.top_n, 1u);
    EXPECT_TRUE(r.return_documents);
    r = parse_rerank_request(R"({"query":"q","documents":["a"]})", {});
    EXPECT_FALSE(r.top_n);
    EXPECT_FALSE(r.return_documents);

    using P = std::pair<std::string, std::string>;
    EXPECT_EQ(refusal(rer, R"({"documents":["a"]})"), (P{"'query' is required", "query"}));
    EXPECT_EQ(refusal(rer, R"({"query":"","documents":["a"]})"), (P{"'query' must not be an empty string", "query"}));
    EXPECT_EQ(refusal(rer, R"({"query":"q"})"), (P{"'documents' is required", "documents"}));
    EXPECT_EQ(refusal(rer, R"({"query":"q","documents":[]})"), (P{"'documents' must not be an empty array", "documents"}));
    EXPECT_EQ(refusal(rer, R"({"query":"q","documents":"a"})"), (P{"'documents' must be an array, not string", "documents"}));
    EXPECT_EQ(refusal(rer, R"({"query":"q","documents":[""]})"),
              (P{"'documents[0]' must not be an empty string", "documents"}));
    EXPECT_EQ(refusal(rer, R"({"query":"q","documents":[{"txt":"a"}]})"), (P{"unknown field 'txt'", "txt"}));
    EXPECT_EQ(refusal(rer, R"({"query":"q","documents":[{}]})"), (P{"'documents[0].text' is required", "documents"}));
    EXPECT_EQ(refusal(rer, R"({"query":"q","documents":[1]})"),
              (P{"'documents[0]' must be a string or an object with \"text\", not integer", "documents"}));
    EXPECT_EQ(refusal(rer, R"({"query":"q","documents":["a"],"top_n":0})").second, "top_n");
}

TEST(Pooling, L2NormalisationAndTheRerankScore) {
    const std::vector<float> v = {3, 4};
    EXPECT_EQ(eh::service::l2_normalized(v), (std::vector<float>{0.6f, 0.8f}));
    EXPECT_EQ(eh::service::l2_normalized(std::vector<float>{0, 0}), (std::vector<float>{0, 0}));
    eh::service::PoolingSpec spec;
    spec.rerank_head = {1, -1};  // yes - no
    // Logits yes = 2, no = 0.5 on h: P(yes) = e^2 / (e^2 + e^0.5) = sigmoid(1.5).
    EXPECT_NEAR(eh::service::rerank_score(spec, std::vector<float>{2, 0.5f}), std::exp(2.0) / (std::exp(2.0) + std::exp(0.5)),
                1e-12);
    EXPECT_THROW(eh::service::rerank_score(spec, std::vector<float>{1}), eh::Error);
}

TEST(Pooling, RerankPromptKeepsTheUsersTextLiteral) {
    std::vector<eh::service::TextSpan> lit;
    const std::string p = eh::service::render_rerank("<s>{query}|{document}</s>{query}", "Q<|x|>", "doc", lit);
    EXPECT_EQ(p, "<s>Q<|x|>|doc</s>Q<|x|>");
    ASSERT_EQ(lit.size(), 3u);
    EXPECT_EQ(p.substr(lit[0].begin, lit[0].end - lit[0].begin), "Q<|x|>");
    EXPECT_EQ(p.substr(lit[1].begin, lit[1].end - lit[1].begin), "doc");
    EXPECT_EQ(p.substr(lit[2].begin, lit[2].end - lit[2].begin), "Q<|x|>");
    // A document that holds "{query}" is not expanded again.
    eh::service::render_rerank("{document}", "Q", "{query}", lit);
    EXPECT_EQ(eh::service::render_rerank("{document}", "Q", "{query}", lit), "{query}");
    const std::string q3 = eh::service::kQwen3RerankTemplate;
    EXPECT_NE(q3.find("<Query>: {query}\n<Document>: {document}<|im_end|>"), std::string::npos);
    EXPECT_TRUE(q3.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
}

TEST(Pooling, Base64OfLittleEndianFloats) {
    EXPECT_EQ(eh::service::base64_floats(std::vector<float>{}), "");
    EXPECT_EQ(eh::service::base64_floats(std::vector<float>{1.0f}), "AACAPw==");          // 00 00 80 3f
    EXPECT_EQ(eh::service::base64_floats(std::vector<float>{1.0f, -2.0f}), "AACAPwAAAMA=");  // + 00 00 00 c0
}
