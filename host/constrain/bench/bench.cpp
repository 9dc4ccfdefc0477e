// Mask cost per token, the number that decides whether constrained
// decoding keeps up with the GPU (a Qwen2.5-0.5B decode step is ~0.64 ms at
// batch 1, so the 10 % budget is ~64 us a token). Replays real JSON
// documents, tokenized by the model's own tokenizer, through a matcher the
// way the scheduler does (mask, then accept the token), and times each
// token: a cold pass (fresh automaton: every state's mask walks the
// vocabulary trie), then new documents and repeats on the warm automaton
// (a server that has seen the schema before). With --grammar, the same for
// one GBNF grammar over lowercase text, each token's work in kMaxMaskWork's
// units too (docs/robustness.md, slow masks).
//   eh-constrain-bench ../shared/testdata/tokenizers/qwen2.5/tokenizer.json
//   eh-constrain-bench TOKENIZER_JSON --grammar 'root ::= ( [a-z ] | ){1000}' [TEXT]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "eh/constrain/automaton.hpp"
#include "eh/error.hpp"
#include "eh/constrain/grammar.hpp"
#include "eh/tokenizer/tokenizer.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using eh::constrain::Matcher;

const char* kSchema = R"({"type":"object","properties":{
  "name":{"type":"string"},"age":{"type":"integer"},"email":{"type":["string","null"]},
  "address":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"},
     "zip":{"type":"string"}},"required":["street","city","zip"],"additionalProperties":false},
  "tags":{"type":"array","items":{"type":"string"}},"score":{"type":"number"},
  "status":{"enum":["active","inactive","banned"]}},
  "required":["name","age","email","address","tags","score","status"],"additionalProperties":false})";

const std::vector<std::string> kDocs = {
    R"({"name": "Alice Johnson", "age": 34, "email": "alice@example.com", "address": {"street": "12 Main Street", "city": "Springfield", "zip": "49007"}, "tags": ["admin", "early-adopter"], "score": 87.5, "status": "active"})",
    R"({"name": "Bob", "age": 7, "email": null, "address": {"street": "Rue de la Paix 3", "city": "Paris", "zip": "75002"}, "tags": [], "score": -1.25e2, "status": "banned"})",
    "{\n  \"name\": \"Chlo\xC3\xAB \xE6\x9D\x8E\",\n  \"age\": 101,\n  \"email\": \"c@x.org\",\n  \"address\": {\"street\": \"1\", \"city\": \"Z\xC3\xBCrich\", \"zip\": \"8001\"},\n  \"tags\": [\"a\", \"b\", \"c\"],\n  \"score\": 0.5,\n  \"status\": \"inactive\"\n}",
    R"({"name":"D","age":0,"email":"d@d.d","address":{"street":"s","city":"c","zip":"z"},"tags":["x"],"score":3,"status":"active"})",
};

struct Pass {
    std::vector<double> us;
    void add(double v) { us.push_back(v); }
    void print(const char* what) {
        std::sort(us.begin(), us.end());
        double sum = 0;
        for (double v : us) sum += v;
        auto pct = [&](double p) { return us[std::min(us.size() - 1, size_t(p * double(us.size())))]; };
        std::printf("%-34s tokens %5zu  mean %8.2f us  p50 %7.2f  p90 %8.2f  p99 %8.2f  max %9.2f\n", what, us.size(),
                    sum / double(us.size()), pct(0.5), pct(0.9), pct(0.99), us.back());
    }
};

// One document through a matcher: mask + accept per token, as the scheduler does.
void replay(const std::shared_ptr<eh::constrain::Automaton>& a, const std::vector<int32_t>& ids, Pass& pass) {
    Matcher m(a);
    for (int32_t id : ids) {
        const auto t0 = Clock::now();
        auto mask = m.mask();
        const bool allowed = ((*mask)[uint32_t(id) / 32] >> (uint32_t(id) % 32)) & 1u;
        const bool ok = allowed && m.accept(id);
        (void)m.complete();
        pass.add(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        if (!ok) {
            std::fprintf(stderr, "token %d refused: the document does not match the schema?\n", id);
            std::exit(1);
        }
    }
}

// One grammar, cold, over `text`: per-token time and work; a grammar the
// compiler or the mask budget refuses prints its error.
int grammar_mode(const std::shared_ptr<const eh::constrain::TokenVocab>& vocab, const eh::tokenizer::Tokenizer& tok,
                 const std::string& gbnf, const std::string& text) {
    const auto ids = tok.encode(text, false, false);
    try {
        const auto t0 = Clock::now();
        auto a = std::make_shared<eh::constrain::Automaton>(eh::constrain::gbnf_grammar(gbnf), vocab);
        std::printf("compiled in %.2f ms\n", std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        Pass pass;
        replay(a, ids, pass);
        pass.print("per token");
        const auto st = a->stats();
        std::printf("most work in one mask: %zu units (limit %zu); %zu states, %zu trie nodes walked\n", st.max_mask_work,
                    eh::constrain::kMaxMaskWork, st.states, st.walk_nodes);
    } catch (const eh::Error& e) {
        std::printf("refused: %s\n", e.what());
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2 || (argc >= 3 && std::string(argv[2]) == "--grammar" && argc < 4)) {
        std::fprintf(stderr, "usage: %s TOKENIZER_JSON [--grammar GBNF [TEXT]]\n", argv[0]);
        return 2;
    }
    auto tok = eh::tokenizer::Tokenizer::from_hf_json(argv[1]);
    auto t0 = Clock::now();
    std::vector<std::string> bytes(tok->vocab_size());
    std::vector<int32_t> eog;
    for (size_t i = 0; i < bytes.size(); ++i) {
        if (tok->is_eog(int32_t(i))) eog.push_back(int32_t(i));
        else bytes[i] = tok->token_to_piece(int32_t(i), false);
    }
    auto vocab = std::make_shared<const eh::constrain::TokenVocab>(std::move(bytes), std::move(eog));
    const double vocab_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (argc >= 4)
        return grammar_mode(vocab, *tok, argv[3],
                            argc >= 5 ? argv[4]
                                      : "the quick brown fox jumps over the lazy dog and then it runs far away into the "
                                        "deep green forest where nobody can find it again");
    t0 = Clock::now();
    auto grammar = eh::constrain::json_schema_grammar(kSchema);
    auto a = std::make_shared<eh::constrain::Automaton>(grammar, vocab);
    const double compile_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    std::printf("vocabulary %zu tokens, trie %zu nodes, built in %.1f ms; schema compiled in %.2f ms\n", vocab->size(),
                vocab->nodes().size(), vocab_ms, compile_ms);

    std::vector<std::vector<int32_t>> docs;
    for (const auto& d : kDocs) docs.push_back(tok->encode(d, false, false));

    Pass cold, fresh_docs, warm;
    replay(a, docs[0], cold);
    auto s = a->stats();
    std::printf("after the cold document: %zu states, %zu masks, %zu trie walks visiting %zu nodes (%.0f per walk)\n",
                s.states, s.masks, s.mask_walks, s.walk_nodes, double(s.walk_nodes) / double(std::max<size_t>(1, s.mask_walks)));
    for (size_t i = 1; i < docs.size(); ++i) replay(a, docs[i], fresh_docs);
    for (int rep = 0; rep < 50; ++rep)
        for (const auto& d : docs) replay(a, d, warm);
    cold.print("cold (first document, new schema)");
    fresh_docs.print("new documents, warm schema");
    warm.print("repeated documents (steady state)");
    s = a->stats();
    std::printf("end: %zu states, %zu cached masks, %zu walks; most work in one mask %zu units (limit %zu)\n", s.states,
                s.masks, s.mask_walks, s.max_mask_work, eh::constrain::kMaxMaskWork);
    return 0;
}
