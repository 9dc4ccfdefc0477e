// Chat templates: the real template texts run through the Jinja subset.
#include <gtest/gtest.h>
#include <simdjson.h>

#include <algorithm>
#include <cstdlib>
#include <map>

#include "eh/error.hpp"
#include "eh/tokenizer/chat_template.hpp"
#include "eh/tokenizer/tokenizer.hpp"
#include "test_util.hpp"

namespace eh::tokenizer {
namespace {

using test::testdata;

std::string render(std::string_view tmpl, std::string_view messages, ChatOptions o = {}) {
    return ChatTemplate::compile(tmpl)->render(messages, o);
}

const char* kConversation = R"([
  {"role": "system", "content": "You are terse."},
  {"role": "user", "content": "Hi there"},
  {"role": "assistant", "content": "Hello."},
  {"role": "user", "content": "2+2?"}
])";

// Hand-written ChatML, so CI checks the real Qwen2.5 template without vectors.
TEST(ChatTemplate, Qwen25ChatMLByHand) {
    auto tok = Tokenizer::from_hf_json(testdata() / "tokenizers/qwen2.5");
    ChatOptions o;
    o.eos_token = "<|im_end|>";
    EXPECT_EQ(render(tok->chat_template(), kConversation, o),
              "<|im_start|>system\nYou are terse.<|im_end|>\n"
              "<|im_start|>user\nHi there<|im_end|>\n"
              "<|im_start|>assistant\nHello.<|im_end|>\n"
              "<|im_start|>user\n2+2?<|im_end|>\n"
              "<|im_start|>assistant\n");
    o.add_generation_prompt = false;
    EXPECT_EQ(render(tok->chat_template(), R"([{"role":"user","content":"Hello!"}])", o),
              "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
              "<|im_start|>user\nHello!<|im_end|>\n");
}

TEST(ChatTemplate, Qwen25ToolCallByHand) {
    auto tok = Tokenizer::from_hf_json(testdata() / "tokenizers/qwen2.5");
    ChatOptions o;
    o.tools_json = R"([{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}])";
    const std::string got = render(tok->chat_template(), R"([
        {"role":"user","content":"q"},
        {"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"f","arguments":{"x":1}}}]},
        {"role":"tool","content":"42"}])", o);
    EXPECT_EQ(got,
              "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\n"
              "You may call one or more functions to assist with the user query.\n\n"
              "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
              "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}\n</tools>\n\n"
              "For each function call, return a json object with function name and arguments within "
              "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
              "<args-json-object>}\n</tool_call><|im_end|>\n"
              "<|im_start|>user\nq<|im_end|>\n"
              "<|im_start|>assistant\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call><|im_end|>\n"
              "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
              "<|im_start|>assistant\n");
}

TEST(ChatTemplate, Phi3FromTokenizerConfigByHand) {
    auto tok = Tokenizer::from_hf_json(testdata() / "tokenizers/phi-3-mini");
    ChatOptions o;
    o.eos_token = "<|endoftext|>";
    EXPECT_EQ(render(tok->chat_template(), kConversation, o),
              "<|system|>\nYou are terse.<|end|>\n<|user|>\nHi there<|end|>\n<|assistant|>\nHello.<|end|>\n"
              "<|user|>\n2+2?<|end|>\n<|assistant|>\n");
    o.add_generation_prompt = false;
    EXPECT_EQ(render(tok->chat_template(), R"([{"role":"user","content":"x"}])", o),
              "<|user|>\nx<|end|>\n<|endoftext|>");
}

TEST(ChatTemplate, GptOssHarmonyByHand) {
    auto tok = Tokenizer::from_hf_json(testdata() / "tokenizers/gpt-oss-20b");
    ASSERT_FALSE(tok->chat_template().empty());
    ChatOptions o;
    o.now = "2025-01-15 00:00:00";
    o.extra_json = R"({"reasoning_effort": "low"})";
    EXPECT_EQ(render(tok->chat_template(), R"([{"role":"user","content":"Hi"}])", o),
              "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
              "Knowledge cutoff: 2024-06\nCurrent date: 2025-01-15\n\nReasoning: low\n\n"
              "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
              "<|start|>user<|message|>Hi<|end|><|start|>assistant");
}

// The harmony output parser reads gpt-oss's channels from the text of its
// control tokens: decoding with include_special writes them back exactly,
// and without it they vanish (so chat output on harmony models decodes with).
TEST(ChatTemplate, GptOssHarmonyControlTokensRoundTrip) {
    auto tok = Tokenizer::from_hf_json(testdata() / "tokenizers/gpt-oss-20b");
    const std::string text =
        "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
        "<|constrain|>json<|message|>{\"city\":\"Paris\"}";
    auto ids = tok->encode(text, false, true);
    for (const char* marker : {"<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|constrain|>"}) {
        auto id = tok->token_id(marker);
        ASSERT_TRUE(id) << marker;
        EXPECT_TRUE(tok->is_special(*id)) << marker;
        EXPECT_NE(std::find(ids.begin(), ids.end(), *id), ids.end()) << marker;
    }
    EXPECT_EQ(tok->decode(ids, true), text);
    EXPECT_EQ(tok->decode(ids, false).find("<|"), std::string::npos);
    // <|call|> and <|return|> end generation; <|end|> does not (more channels follow).
    EXPECT_TRUE(tok->is_eog(*tok->token_id("<|call|>")));
    EXPECT_TRUE(tok->is_eog(*tok->token_id("<|return|>")));
    EXPECT_FALSE(tok->is_eog(*tok->token_id("<|end|>")));
}

TEST(ChatTemplate, TemplateRaiseExceptionIsInvalidRequest) {
    auto tok = Tokenizer::from_hf_json(testdata() / "tokenizers/gpt-oss-20b");
    try {
        render(tok->chat_template(),
               R"([{"role":"assistant","content":"<|channel|>final<|message|>x"},{"role":"user","content":"y"}])");
        FAIL() << "expected raise_exception";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), Code::InvalidRequest);
        EXPECT_NE(std::string(e.what()).find("<|channel|> tags"), std::string::npos);
    }
}

// Gemma 3's turn format, in a template written for this test with the
// constructs Gemma's published template relies on: a system message folded
// into the first user turn (string or typed-part content), messages[1:],
// strict user/model alternation checked with loop.index0 and
// raise_exception, 'assistant' renamed 'model', typed content parts
// (an image part becomes its marker), | trim, add_generation_prompt.
const char* kGemmaStyleTemplate = R"({{- bos_token -}}
{%- if messages[0]['role'] == 'system' -%}
  {%- if messages[0]['content'] is string -%}
    {%- set head = messages[0]['content'] ~ '

' -%}
  {%- else -%}
    {%- set head = messages[0]['content'][0]['text'] ~ '

' -%}
  {%- endif -%}
  {%- set turns = messages[1:] -%}
{%- else -%}
  {%- set head = '' -%}
  {%- set turns = messages -%}
{%- endif -%}
{%- for msg in turns -%}
  {%- if (msg['role'] == 'user') != (loop.index0 % 2 == 0) -%}
    {{- raise_exception('turns must alternate user/assistant') -}}
  {%- endif -%}
  {%- set speaker = 'model' if msg['role'] == 'assistant' else msg['role'] -%}
  {{- '<start_of_turn>' + speaker + '
' + (head if loop.first else '') -}}
  {%- if msg['content'] is string -%}
    {{- msg['content'] | trim -}}
  {%- elif msg['content'] is iterable -%}
    {%- for part in msg['content'] -%}
      {%- if part['type'] == 'image' -%}{{- '<start_of_image>' -}}
      {%- elif part['type'] == 'text' -%}{{- part['text'] | trim -}}
      {%- endif -%}
    {%- endfor -%}
  {%- else -%}
    {{- raise_exception('unknown content') -}}
  {%- endif -%}
  {{- '<end_of_turn>
' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<start_of_turn>model
' -}}{%- endif -%})";

TEST(ChatTemplate, GemmaTurnFormat) {
    ChatOptions o;
    o.bos_token = "<bos>";
    EXPECT_EQ(render(kGemmaStyleTemplate, kConversation, o),
              "<bos><start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n"
              "<start_of_turn>model\nHello.<end_of_turn>\n"
              "<start_of_turn>user\n2+2?<end_of_turn>\n"
              "<start_of_turn>model\n");
    // typed parts, a system message given as parts, no generation prompt
    o.add_generation_prompt = false;
    EXPECT_EQ(render(kGemmaStyleTemplate, R"([
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "  What is this?  "}]}])", o),
              "<bos><start_of_turn>user\nBe brief.\n\n<start_of_image>What is this?<end_of_turn>\n");
    // two user turns in a row
    try {
        render(kGemmaStyleTemplate, R"([{"role":"user","content":"a"},{"role":"user","content":"b"}])", o);
        FAIL() << "expected raise_exception";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), Code::InvalidRequest);
        EXPECT_NE(std::string(e.what()).find("turns must alternate"), std::string::npos) << e.what();
    }
}

TEST(Jinja, ScopingNamespacesMacros) {
    // A set inside a for body does not leak; a namespace attribute does.
    EXPECT_EQ(render("{% set x = 1 %}{% set ns = namespace(y=1) %}{% for i in [1,2] %}{% set x = 5 %}"
                     "{% set ns.y = ns.y + i %}{% endfor %}{{ x }} {{ ns.y }}",
                     "[]"),
              "1 4");
    EXPECT_EQ(render("{% macro m(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m('x', b=2) }}", "[]"), "[1B][x2]");
    EXPECT_EQ(render("{%- for k, v in {'a': 1, 'b': [1, 'x']}.items() -%}{{ k }}={{ v|tojson }};{%- endfor %}", "[]"),
              "a=1;b=[1, \"x\"];");
    EXPECT_EQ(render("{{ messages[1:]|length }} {{ messages[0].content|upper }} {{ 'a' if not messages else 'b' }}",
                     R"([{"content":"hi"},{"content":"yo"}])"),
              "1 HI b");
    EXPECT_EQ(render("{{ [1,2,3]|join(', ') }}|{{ 'x' ~ 1 }}|{{ 7 // 2 }}|{{ -7 % 3 }}|{{ none is none }}|{{ 'ab' in 'cabd' }}", "[]"),
              "1, 2, 3|x1|3|2|True|True");
    EXPECT_EQ(render("{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ loop.index }}{% endfor %}", "[]"), "123");
}

TEST(Jinja, WhitespaceControlAsTransformers) {
    // trim_blocks drops the newline after a block tag; lstrip_blocks the
    // indentation before it; "-" strips all whitespace on its side.
    EXPECT_EQ(render("a\n  {% if true %}\n  b\n  {% endif %}\nc", "[]"), "a\n  b\nc");
    EXPECT_EQ(render("a  {{- ' b ' -}}  c", "[]"), "a b c");
    EXPECT_EQ(render("x {# note #}\ny", "[]"), "x y");
}

TEST(Jinja, SyntaxErrorsNameTheLine) {
    try {
        ChatTemplate::compile("ok\n{% if x %}\n{% frobnicate %}\n{% endif %}");
        FAIL();
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), Code::InvalidRequest);
        EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
    }
    EXPECT_THROW(ChatTemplate::compile("{{ 'unterminated }}"), Error);
    EXPECT_THROW(ChatTemplate::compile("{% for x in y %}"), Error);
}

std::string str(simdjson::dom::element e) { return std::string(std::string_view(e)); }

// Byte-for-byte against transformers' apply_chat_template (make_chat_vectors.py).
TEST(ChatTemplate, MatchesTransformersVectors) {
    std::filesystem::path file = std::filesystem::path(EH_TOKENIZER_TEST_DATA) / "chat_vectors.json";
    if (const char* env = std::getenv("EH_CHAT_VECTORS")) file = env;
    if (!std::filesystem::exists(file))
        GTEST_SKIP() << file << " does not exist yet: run tests/tokenizer/make_chat_vectors.py where "
                     << "transformers is installed";
    simdjson::dom::parser parser;
    simdjson::padded_string json = simdjson::padded_string::load(file.string());
    simdjson::dom::element root = parser.parse(json);
    std::map<std::string, std::shared_ptr<const ChatTemplate>> compiled;
    size_t n = 0, ok = 0;
    for (simdjson::dom::element c : simdjson::dom::array(root["cases"])) {
        const std::string tmpl = str(c["template"]);
        if (!compiled.count(tmpl))
            compiled[tmpl] = ChatTemplate::compile(Tokenizer::from_hf_json(testdata() / "tokenizers" / tmpl)->chat_template());
        ChatOptions o;
        o.add_generation_prompt = bool(c["add_generation_prompt"]);
        o.bos_token = str(c["bos_token"]);
        o.eos_token = str(c["eos_token"]);
        o.now = str(root["now"]);
        if (!c["tools"].is_null()) o.tools_json = simdjson::to_string(c["tools"]);
        o.extra_json = simdjson::to_string(c["extra"]);
        const std::string expected = str(c["expected"]);
        const std::string got = compiled[tmpl]->render(simdjson::to_string(c["messages"]), o);
        EXPECT_EQ(got, expected) << tmpl << " / " << std::string_view(c["name"]) << " agp=" << o.add_generation_prompt;
        ++n;
        ok += got == expected;
    }
    std::printf("[chat templates vs %s] %zu/%zu match\n", str(root["engine"]).c_str(), ok, n);
}

}  // namespace
}  // namespace eh::tokenizer
