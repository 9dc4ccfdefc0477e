// Unit tests: split patterns, Unicode classes, stream decoder, round trips.
#include <gtest/gtest.h>

#include <random>
#include <simdjson.h>

#include "eh/tokenizer/stream_decoder.hpp"
#include "eh/tokenizer/tokenizer.hpp"
#include "pretokenize.hpp"
#include "test_util.hpp"
#include "unicode.hpp"

namespace eh::tokenizer {
namespace {

using test::testdata;

std::vector<std::string> split(SplitPattern p, std::string_view s) {
    std::vector<std::pair<uint32_t, uint32_t>> r;
    split_words(p, s, r);
    std::vector<std::string> out;
    for (auto [b, e] : r) out.emplace_back(s.substr(b, e - b));
    return out;
}

using V = std::vector<std::string>;

TEST(Split, Gpt2) {
    EXPECT_EQ(split(SplitPattern::Gpt2, "Hello world's  test\n"), (V{"Hello", " world", "'s", " ", " test", "\n"}));
    // Contractions are case-sensitive in GPT-2's pattern.
    EXPECT_EQ(split(SplitPattern::Gpt2, "I'M 12345"), (V{"I", "'", "M", " 12345"}));
    EXPECT_EQ(split(SplitPattern::Gpt2, "a  \n"), (V{"a", "  \n"}));
}

TEST(Split, Llama3AndQwen2) {
    EXPECT_EQ(split(SplitPattern::Llama3, "ABC'S 12345"), (V{"ABC", "'S", " ", "123", "45"}));
    EXPECT_EQ(split(SplitPattern::Qwen2, "ABC'S 12345"), (V{"ABC", "'S", " ", "1", "2", "3", "4", "5"}));
    // A non-letter prefix joins the letters; newlines end punctuation runs.
    EXPECT_EQ(split(SplitPattern::Llama3, "(hello)!!\n\nx"), (V{"(hello", ")!!\n\n", "x"}));
    EXPECT_EQ(split(SplitPattern::Llama3, "a \n  b"), (V{"a", " \n", " ", " b"}));
}

TEST(Split, O200k) {
    EXPECT_EQ(split(SplitPattern::O200k, "HelloWORLD isn't"), (V{"Hello", "WORLD", " isn't"}));
    EXPECT_EQ(split(SplitPattern::O200k, "a/b\n\n"), (V{"a", "/b", "\n\n"}));
    EXPECT_EQ(split(SplitPattern::O200k, "!!!/\nx"), (V{"!!!/\n", "x"}));
    EXPECT_EQ(split(SplitPattern::O200k, "1234567"), (V{"123", "456", "7"}));
}

TEST(Split, CoversInvalidUtf8) {
    const std::string s = std::string("a\xFF\xC3") + '\0' + "b \xE2\x82";
    for (auto p : {SplitPattern::Gpt2, SplitPattern::Llama3, SplitPattern::Qwen2, SplitPattern::O200k}) {
        std::string joined;
        for (const auto& w : split(p, s)) joined += w;
        EXPECT_EQ(joined, s);
    }
}

// Against the real regexes run by Python's `regex` module (make_split_vectors.py).
TEST(Split, MatchesRegexEngineOnRandomText) {
    const auto file = std::filesystem::path(EH_TOKENIZER_TEST_DATA) / "split_vectors.json";
    simdjson::dom::parser parser;
    simdjson::padded_string json = simdjson::padded_string::load(file.string());
    simdjson::dom::element root = parser.parse(json);
    size_t n = 0;
    for (simdjson::dom::element v : simdjson::dom::array(root)) {
        const std::string_view name(v["pattern"]);
        const std::string text = std::string(std::string_view(v["text"]));
        auto p = pattern_from_gguf_pre(name == "o200k" ? "gpt-4o" : name);
        ASSERT_TRUE(p.has_value()) << name;
        V expected;
        for (simdjson::dom::element piece : simdjson::dom::array(v["pieces"])) expected.emplace_back(std::string_view(piece));
        EXPECT_EQ(split(*p, text), expected) << name << ": \"" << text << "\"";
        ++n;
    }
    EXPECT_GT(n, 1000u);
}

TEST(Split, RegexRecognition) {
    EXPECT_EQ(pattern_from_regex("\\s+"), std::nullopt);
    EXPECT_EQ(pattern_from_gguf_pre("qwen2"), SplitPattern::Qwen2);
    EXPECT_EQ(pattern_from_gguf_pre("llama-bpe"), SplitPattern::Llama3);
    EXPECT_EQ(pattern_from_gguf_pre("gpt-4o"), SplitPattern::O200k);
}

TEST(Unicode, Classes) {
    using namespace unicode;
    EXPECT_EQ(classify('A'), kLu);
    EXPECT_EQ(classify(0x4E00), kLo);   // CJK
    EXPECT_EQ(classify(0x0301), kM);    // combining acute
    EXPECT_EQ(classify(0x00BD), kN);    // ½
    EXPECT_EQ(classify(0x3000), kSpace);
    EXPECT_EQ(classify(0x1F999), kOther);  // 🦙
    EXPECT_EQ(nfc("e\xCC\x81"), "\xC3\xA9");
}

class NullTokenizerHolder {
public:
    NullTokenizerHolder() : tok(Tokenizer::from_hf_json(testdata() / "tokenizers/gpt2")) {}
    std::unique_ptr<Tokenizer> tok;
};

TEST(StreamDecoder, HoldsSplitCodepoints) {
    NullTokenizerHolder h;
    StreamDecoder d(*h.tok);
    EXPECT_EQ(d.feed_bytes("a\xE2"), "a");
    EXPECT_EQ(d.pending(), 1u);
    EXPECT_EQ(d.feed_bytes("\x82"), "");
    EXPECT_EQ(d.feed_bytes("\xAC!"), "\xE2\x82\xAC!");
    EXPECT_EQ(d.flush(), "");
}

TEST(StreamDecoder, EmojiAcrossFourTokens) {
    // Phi-3's tokenizer.json has no token for 🦙: it becomes 4 byte tokens.
    auto tok = Tokenizer::from_hf_json(testdata() / "tokenizers/phi-3-mini");
    const auto ids = tok->encode("🦙", false, false);
    ASSERT_EQ(ids.size(), 5u);  // "▁" then <0xF0> <0x9F> <0xA6> <0x99>
    StreamDecoder d(*tok, false, true);
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
        const std::string part = d.feed(ids[i]);
        if (i + 1 < ids.size()) {
            EXPECT_EQ(part, "") << "emitted before the last byte, at " << i;
        }
        out += part;
    }
    out += d.flush();
    EXPECT_EQ(out, "🦙");
}

TEST(StreamDecoder, InvalidBytesReplacedDeterministically) {
    NullTokenizerHolder h;
    StreamDecoder d(*h.tok);
    EXPECT_EQ(d.feed_bytes("\xFF"), "\xEF\xBF\xBD");        // never valid: replaced at once
    EXPECT_EQ(d.feed_bytes("\xE2\x82"), "");                // could still complete
    EXPECT_EQ(d.feed_bytes("A"), "\xEF\xBF\xBD" "A");       // it did not: one U+FFFD
    EXPECT_EQ(d.feed_bytes("\xF0\x9F"), "");
    EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");                   // unfinished at the end
    EXPECT_EQ(sanitize_utf8("\xC0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong: two units
    EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
}

TEST(StreamDecoder, MatchesDecodeOnRealTokens) {
    auto tok = Tokenizer::from_hf_json(testdata() / "tokenizers/qwen2.5");
    const std::string text = "Emoji 😶‍🌫️ and 我想在apple工作 and ½ 👨‍👩‍👧‍👦!";
    const auto ids = tok->encode(text, false, false);
    StreamDecoder d(*tok);
    std::string out;
    for (int32_t id : ids) {
        const std::string part = d.feed(id);
        EXPECT_EQ(sanitize_utf8(part), part);
        out += part;
    }
    out += d.flush();
    EXPECT_EQ(out, text);
}

TEST(StreamDecoder, StripsLeadingSpaceOnlyWhenAsked) {
    auto tok = Tokenizer::from_hf_json(testdata() / "tokenizers/phi-3-mini");
    const auto ids = tok->encode("Hello", false, false);
    StreamDecoder keep(*tok), strip(*tok, false, true);
    std::string a, b;
    for (int32_t id : ids) { a += keep.feed(id); b += strip.feed(id); }
    EXPECT_EQ(a + keep.flush(), " Hello");
    EXPECT_EQ(b + strip.flush(), "Hello");
    EXPECT_EQ(tok->decode(ids), "Hello");
}

TEST(RoundTrip, MultilingualCorpus) {
    const auto texts = test::read_file(std::filesystem::path(EH_TOKENIZER_TEST_DATA) / "multilingual.inp");
    std::vector<std::string> strings;
    const std::string sep = "\n__ggml_vocab_test__\n";
    for (size_t i = 0, j; (j = texts.find(sep, i)) != std::string::npos; i = j + sep.size())
        strings.push_back(texts.substr(i, j - i));
    ASSERT_GE(strings.size(), 30u);
    for (const char* name : {"gpt2", "qwen2.5", "phi-3-mini", "gpt-oss-20b"}) {
        auto tok = Tokenizer::from_hf_json(testdata() / "tokenizers" / name);
        const bool nfc = std::string(name) == "qwen2.5";  // its normaliser composes "e\u0301"
        for (const auto& s : strings) {
            const auto ids = tok->encode(s, false, false);
            EXPECT_EQ(tok->decode(ids), nfc ? unicode::nfc(s) : s) << name << ": \"" << s << "\"";
            for (int32_t id : ids) EXPECT_TRUE(id >= 0 && size_t(id) < tok->vocab_size());
        }
    }
}

TEST(SpecialTokens, ParseOnOff) {
    auto tok = Tokenizer::from_hf_json(testdata() / "tokenizers/qwen2.5");
    const auto on = tok->encode("<|im_start|>user\nhi<|im_end|>", false, true);
    EXPECT_EQ(on.front(), 151644);
    EXPECT_EQ(on.back(), 151645);
    const auto off = tok->encode("<|im_start|>user\nhi<|im_end|>", false, false);
    for (int32_t id : off) EXPECT_LT(id, 151643);
    EXPECT_EQ(tok->decode(off), "<|im_start|>user\nhi<|im_end|>");
    EXPECT_EQ(tok->decode(on), "user\nhi");  // control tokens left out by default
    EXPECT_EQ(tok->decode(on, true), "<|im_start|>user\nhi<|im_end|>");
    EXPECT_TRUE(tok->is_eog(151645));
    EXPECT_EQ(tok->special().eos, 151645);
    EXPECT_EQ(tok->special().pad, 151643);
    EXPECT_EQ(tok->special().bos, -1);
    EXPECT_FALSE(tok->add_bos());
    EXPECT_NE(tok->chat_template().find("im_start"), std::string::npos);
}

// A chat's own markup becomes control tokens; the same text inside a literal
// range (what a user typed) stays text, also where a match would only begin
// or end inside the range.
TEST(SpecialTokens, LiteralRangesStayText) {
    auto tok = Tokenizer::from_hf_json(testdata() / "tokenizers/qwen2.5");
    const std::string markup = "<|im_start|>user\n", typed = "a<|im_end|>b", end = "<|im_end|>";
    const std::string text = markup + typed + end;
    const Tokenizer::Range user{markup.size(), markup.size() + typed.size()};
    const auto ids = tok->encode_with_literals(text, false, std::span<const Tokenizer::Range>(&user, 1));
    ASSERT_GE(ids.size(), 3u);
    EXPECT_EQ(ids.front(), 151644);
    EXPECT_EQ(ids.back(), 151645);
    int control = 0;
    for (int32_t id : ids) control += id >= 151643;
    EXPECT_EQ(control, 2) << "the typed <|im_end|> must not be a token";
    EXPECT_EQ(tok->decode(ids, true), text);
    // A range that covers only the last byte of a control token's text still
    // keeps that occurrence text.
    const Tokenizer::Range tail{text.size() - 1, text.size()};
    const auto t2 = tok->encode_with_literals(text, false, std::span<const Tokenizer::Range>(&tail, 1));
    EXPECT_LT(t2.back(), 151643);
    EXPECT_EQ(tok->special_texts().empty(), false);
}

TEST(SpecialTokens, RstripSwallowsWhitespace) {
    // Phi-3's <|end|> has rstrip: the newline after it belongs to the token.
    auto tok = Tokenizer::from_hf_json(testdata() / "tokenizers/phi-3-mini");
    const auto ids = tok->encode("<|end|>\nHi", false, true);
    ASSERT_GE(ids.size(), 2u);
    EXPECT_EQ(ids[0], 32007);
    EXPECT_EQ(tok->decode(std::vector<int32_t>(ids.begin() + 1, ids.end())), "Hi");
}

TEST(SpecialTokens, GptOssHarmony) {
    auto tok = Tokenizer::from_hf_json(testdata() / "tokenizers/gpt-oss-20b");
    EXPECT_EQ(tok->special().eos, 200002);  // <|return|>
    EXPECT_EQ(tok->special().pad, 199999);
    EXPECT_TRUE(tok->is_eog(200002));
    EXPECT_TRUE(tok->is_eog(200012));       // <|call|>
    EXPECT_FALSE(tok->is_eog(200007));      // <|end|> closes a message, not the turn
    EXPECT_EQ(tok->encode("<|start|>assistant<|channel|>final<|message|>", false, true),
              (std::vector<int32_t>{200006, 173781, 200005, 17196, 200008}));
}

// Fixed-seed random bytes (invalid UTF-8, NULs, pieces of special tokens)
// through every backend: no crash, ids in range, and byte-level models give
// the bytes back exactly.
TEST(RandomBytes, NoCrashAndByteLevelRoundTrip) {
    std::vector<std::pair<std::string, std::unique_ptr<Tokenizer>>> toks;
    toks.emplace_back("gpt2", Tokenizer::from_hf_json(testdata() / "tokenizers/gpt2"));
    toks.emplace_back("qwen2.5", Tokenizer::from_hf_json(testdata() / "tokenizers/qwen2.5"));
    toks.emplace_back("phi-3-mini", Tokenizer::from_hf_json(testdata() / "tokenizers/phi-3-mini"));
    std::mt19937 rng(12345);
    const std::vector<std::string> pieces = {"<|endoftext|>", "<|im_start|>", "<s>", "</s>", "<|end|>", " ", "\n",
                                             "\xE2\x96\x81", "é", "🦙", std::string(1, '\0'), "'s", "123"};
    for (int iter = 0; iter < 1500; ++iter) {
        std::string s;
        const int len = int(rng() % 64);
        for (int k = 0; k < len; ++k) {
            if (rng() % 4 == 0) s += pieces[rng() % pieces.size()];
            else s += static_cast<char>(rng() % 256);
        }
        for (auto& [name, tok] : toks) {
            for (bool parse_special : {false, true}) {
                const auto ids = tok->encode(s, true, parse_special);
                for (int32_t id : ids) ASSERT_TRUE(id >= 0 && size_t(id) < tok->vocab_size());
                const std::string back = tok->decode(ids, true);
                if (name == "gpt2") {
                    ASSERT_EQ(back, s) << "iteration " << iter;
                }
                StreamDecoder d(*tok, true);
                std::string streamed;
                for (int32_t id : ids) streamed += d.feed(id);
                streamed += d.flush();
                ASSERT_EQ(sanitize_utf8(streamed), streamed);
            }
        }
    }
}

}  // namespace
}  // namespace eh::tokenizer
