// In-process tests of the service pieces: UTF-8 handling, incremental
// detokenization, stop strings, metrics text, and the service loop driving
// the real test engine plugin through the ABI.
#include <gtest/gtest.h>

#include <thread>

#include "eh/loader/plugin_loader.hpp"
#include "eh/service/chat_prompt.hpp"
#include "eh/service/metrics.hpp"
#include "eh/service/service.hpp"
#include "eh/service/stop_matcher.hpp"
#include "eh/service/text_stream.hpp"
#include "eh/service/utf8.hpp"
#include "test_engine_model.hpp"

using namespace eh;
using namespace eh::service;
using eh::test::drain;

TEST(Utf8, HoldsBackIncompleteSequencesOnly) {
    EXPECT_EQ(complete_utf8_prefix("abc"), 3u);
    EXPECT_EQ(complete_utf8_prefix("ab\xE2\x82"), 2u);        // first two bytes of U+20AC
    EXPECT_EQ(complete_utf8_prefix("ab\xE2\x82\xAC"), 5u);
    EXPECT_EQ(complete_utf8_prefix("a\xFF"), 2u);             // never valid: not held
    EXPECT_EQ(sanitize_utf8("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
    EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
    EXPECT_TRUE(is_valid_utf8("h\xC3\xA9llo"));
    EXPECT_FALSE(is_valid_utf8("\xC0\xAF"));                 // overlong
    EXPECT_EQ(utf8_length("h\xC3\xA9"), 2u);
}

TEST(TextStream, NeverSplitsACharacterAcrossByteTokens) {
    ByteCodec codec;
    TextStream ts(codec);
    std::string euro = "\xE2\x82\xAC";
    EXPECT_EQ(ts.push('a'), "a");
    EXPECT_EQ(ts.push(uint8_t(euro[0])), "");
    EXPECT_EQ(ts.push(uint8_t(euro[1])), "");
    EXPECT_EQ(ts.push(uint8_t(euro[2])), euro);
    EXPECT_EQ(ts.push('b'), "b");
    EXPECT_EQ(ts.finish(), "");
}

TEST(TextStream, InvalidBytesBecomeReplacementCharacters) {
    ByteCodec codec;
    TextStream ts(codec);
    std::string out = ts.push(0xFF);
    out += ts.push(0xE2);  // an unfinished sequence at the very end
    out += ts.finish();
    EXPECT_EQ(out, "\xEF\xBF\xBD\xEF\xBF\xBD");
    EXPECT_TRUE(is_valid_utf8(out));
}

TEST(StopMatcher, StopStringNeverLeaksEvenInPart) {
    StopMatcher m({"END"});
    std::string sent;
    for (std::string piece : {"hello E", "N", "D tail"}) {
        auto r = m.feed(piece);
        sent += r.emit;
        if (r.stopped) break;
        EXPECT_EQ(sent.find('E'), std::string::npos) << "a stop prefix was sent early";
    }
    EXPECT_EQ(sent, "hello ");
}

TEST(StopMatcher, FalseStartIsReleased) {
    StopMatcher m({"END"});
    auto r1 = m.feed("EN");
    EXPECT_EQ(r1.emit, "");
    auto r2 = m.feed("x");
    EXPECT_FALSE(r2.stopped);
    EXPECT_EQ(r2.emit, "ENx");
    auto r3 = m.feed("E");
    EXPECT_EQ(m.flush(), "E");
    (void)r3;
}

TEST(StopMatcher, EarliestOfSeveralStopsWins) {
    StopMatcher m({"bb", "a"});
    auto r = m.feed("xxbbya");
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.emit, "xx");
}

TEST(Metrics, RendersPrometheusTextWithBoundedLabels) {
    Metrics m;
    m.request("execute", "completed");
    m.time_to_first_token(0.02);
    m.inter_token_latency(0.003);
    std::string t = m.render(Gauges{});
    EXPECT_NE(t.find("eh_requests_total{endpoint=\"execute\",outcome=\"completed\"} 1"), std::string::npos);
    EXPECT_NE(t.find("eh_time_to_first_token_seconds_bucket{le=\"0.025\"} 1"), std::string::npos);
    EXPECT_NE(t.find("eh_time_to_first_token_seconds_bucket{le=\"+Inf\"} 1"), std::string::npos);
    EXPECT_NE(t.find("# TYPE eh_queue_depth gauge"), std::string::npos);
    m.inference_duration(0.3);
    t = m.render(Gauges{});
    EXPECT_NE(t.find("# TYPE eh_inference_duration_seconds histogram"), std::string::npos);
    EXPECT_NE(t.find("eh_inference_duration_seconds_bucket{le=\"0.5\"} 1"), std::string::npos);
    EXPECT_NE(t.find("eh_inference_duration_seconds_count 1"), std::string::npos);
}

// The exact text of whole families (HELP, TYPE, samples): scrapers and
// dashboards read these bytes.
TEST(Metrics, FamiliesAreExactText) {
    Metrics m;
    m.request("chat", "completed");
    m.prompt_tokens(12345678901234ull);  // a count stays exact, never 1.2e+13
    Gauges g;
    g.queue_depth = 3;
    g.kv_cache_usage = 0.125;
    g.ready = true;
    const std::string t = m.render(g);
    for (const char* block : {
             "# HELP eh_requests_total Generation requests by endpoint and outcome.\n"
             "# TYPE eh_requests_total counter\n"
             "eh_requests_total{endpoint=\"chat\",outcome=\"completed\"} 1\n"
             "# HELP eh_http_responses_total HTTP responses by route and status class.\n"
             "# TYPE eh_http_responses_total counter\n"
             "# HELP eh_prompt_tokens_total Prompt tokens processed.\n"
             "# TYPE eh_prompt_tokens_total counter\n"
             "eh_prompt_tokens_total 12345678901234\n",
             "# HELP eh_queue_depth Jobs waiting to run.\n# TYPE eh_queue_depth gauge\neh_queue_depth 3\n",
             "# HELP eh_kv_cache_usage_perc Fraction (0-1) of KV-cache blocks held, cached prefixes included.\n"
             "# TYPE eh_kv_cache_usage_perc gauge\neh_kv_cache_usage_perc 0.125\n",
             "# HELP eh_ready 1 when the model is loaded and serving.\n# TYPE eh_ready gauge\neh_ready 1\n",
             "# HELP eh_queue_time_seconds Time from submission to admission into the batch.\n"
             "# TYPE eh_queue_time_seconds histogram\neh_queue_time_seconds_bucket{le=\"0.001\"} 0\n"})
        EXPECT_NE(t.find(block), std::string::npos) << block << "\nnot in:\n" << t;
}

// Every stream opens with `started`: a terminal event for a job that never
// started gets one first; one that started gets no second.
TEST(Job, ATerminalEventBeforeStartedIsPrecededByOne) {
    Job never;
    never.seed = 9;
    never.prompt_tokens = {1, 2, 3};
    JobEvent err;
    err.kind = JobEvent::Kind::Error;
    err.code = Code::Cancelled;
    never.push(err);
    auto a = never.pop(std::chrono::milliseconds(0));
    ASSERT_TRUE(a);
    EXPECT_EQ(a->kind, JobEvent::Kind::Started);
    EXPECT_EQ(a->seed, 9u);
    EXPECT_EQ(a->prompt_tokens, 3u);
    auto b = never.pop(std::chrono::milliseconds(0));
    ASSERT_TRUE(b);
    EXPECT_EQ(b->kind, JobEvent::Kind::Error);
    EXPECT_FALSE(never.pop(std::chrono::milliseconds(0)));

    Job ran;
    JobEvent st;
    st.kind = JobEvent::Kind::Started;
    ran.push(st);
    JobEvent end;
    end.kind = JobEvent::Kind::End;
    ran.push(end);
    EXPECT_EQ(ran.pop(std::chrono::milliseconds(0))->kind, JobEvent::Kind::Started);
    EXPECT_EQ(ran.pop(std::chrono::milliseconds(0))->kind, JobEvent::Kind::End);
    EXPECT_FALSE(ran.pop(std::chrono::milliseconds(0)));
}

// ---- the service loop over the real test engine -------------------------

namespace {

struct Fixture {
    std::shared_ptr<EngineModel> model;
    std::shared_ptr<Service> svc;
    explicit Fixture(ServiceOptions opt = {}, int delay_ms = 0) {
        if (delay_ms) setenv("EH_TEST_ENGINE_DELAY_MS", std::to_string(delay_ms).c_str(), 1);
        else unsetenv("EH_TEST_ENGINE_DELAY_MS");
        model = eh::test::load_test_model(eh::test::load_test_plugin("good/test-engine").api);
        if (!opt.n_ctx) opt.n_ctx = 256;
        svc = std::make_shared<Service>(model, std::make_shared<ByteCodec>(), opt);
    }
};

GenerationRequest req(const std::string& id, uint32_t max_tokens) {
    GenerationRequest r;
    r.job_id = id;
    r.prompt = "hello";
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.sampling.seed = 7;
    return r;
}

}  // namespace

TEST(Service, EventsComeInOrderWithExactlyOneTerminal) {
    Fixture f;
    auto job = f.svc->submit(req("a", 12));
    auto evs = drain(*job);
    ASSERT_GE(evs.size(), 2u);
    EXPECT_EQ(evs.front().kind, JobEvent::Kind::Started);
    EXPECT_EQ(evs.front().prompt_tokens, 5u);
    EXPECT_EQ(evs.front().seed, 7u);
    EXPECT_EQ(evs.back().kind, JobEvent::Kind::End);
    EXPECT_EQ(evs.back().tokens_out, 12u);
    EXPECT_EQ(evs.back().stop_reason, "length");
    std::string text;
    for (size_t i = 1; i + 1 < evs.size(); ++i) {
        EXPECT_EQ(evs[i].kind, JobEvent::Kind::Token);
        text += evs[i].text;
    }
    EXPECT_TRUE(is_valid_utf8(text));
}

TEST(Service, GreedyIsDeterministicAndSeedIsGeneratedWhenAbsent) {
    Fixture f;
    auto a = drain(*f.svc->submit(req("a", 20)));
    auto b = drain(*f.svc->submit(req("b", 20)));
    auto text = [](const std::vector<JobEvent>& e) {
        std::string s;
        for (auto& x : e) if (x.kind == JobEvent::Kind::Token) s += x.text;
        return s;
    };
    EXPECT_EQ(text(a), text(b));
    auto r = req("c", 2);
    r.sampling.seed.reset();
    auto c = drain(*f.svc->submit(r));
    auto d = drain(*f.svc->submit([&] { auto x = req("d", 2); x.sampling.seed.reset(); return x; }()));
    EXPECT_NE(c.front().seed, d.front().seed);  // two fresh 64-bit seeds
}

TEST(Service, TooLongForTheContextIsRejectedWithTheNumbers) {
    ServiceOptions o;
    o.n_ctx = 16;
    Fixture f(o);
    try {
        f.svc->submit(req("a", 12));  // 5 + 12 > 16
        FAIL();
    } catch (const RequestError& e) {
        EXPECT_EQ(e.field(), "max_tokens");
        std::string m = e.what();
        EXPECT_NE(m.find("5 tokens"), std::string::npos) << m;
        EXPECT_NE(m.find("16"), std::string::npos) << m;
        EXPECT_NE(m.find("11"), std::string::npos) << m;
    }
    auto r = req("b", 1);
    r.max_tokens.reset();  // absent: as many as fit
    auto evs = drain(*f.svc->submit(r));
    EXPECT_EQ(evs.back().tokens_out, 11u);
}

TEST(Service, CancelStopsARunningJobPromptly) {
    Fixture f({}, 20);
    auto job = f.svc->submit(req("slow", 200));
    int tokens_before = 0;
    for (;;) {
        auto ev = job->pop(std::chrono::milliseconds(1000));
        ASSERT_TRUE(ev);
        if (ev->kind == JobEvent::Kind::Token && ++tokens_before == 3) break;
    }
    EXPECT_EQ(f.svc->cancel("slow"), "cancelling");
    int after = 0;
    JobEvent last;
    for (;;) {
        auto ev = job->pop(std::chrono::milliseconds(2000));
        ASSERT_TRUE(ev);
        if (ev->kind == JobEvent::Kind::Token) ++after;
        else { last = *ev; break; }
    }
    EXPECT_LE(after, 2) << "tokens generated after cancel";
    EXPECT_EQ(last.kind, JobEvent::Kind::Error);
    EXPECT_EQ(last.code, Code::Cancelled);
    EXPECT_EQ(f.svc->cancel("slow"), "finished");  // idempotent
    EXPECT_EQ(f.svc->cancel("never-seen"), "unknown");
}

TEST(Service, QueueIsBoundedAndQueuedJobsCancelImmediately) {
    ServiceOptions o;
    o.queue_capacity = 1;
    Fixture f(o, 20);
    auto running = f.svc->submit(req("r", 100));
    while (f.svc->active_jobs() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    auto queued = f.svc->submit(req("q", 5));
    EXPECT_THROW(f.svc->submit(req("x", 5)), QueueFullError);
    EXPECT_EQ(f.svc->cancel("q"), "cancelled");
    auto evs = drain(*queued);
    ASSERT_EQ(evs.size(), 2u);  // a job cancelled while queued still opens with `started` (the worker contract)
    EXPECT_EQ(evs[0].kind, JobEvent::Kind::Started);
    EXPECT_EQ(evs[0].seed, 7u);
    EXPECT_FALSE(evs[0].started_at.empty());
    EXPECT_EQ(evs[1].kind, JobEvent::Kind::Error);
    EXPECT_EQ(evs[1].code, Code::Cancelled);
    f.svc->cancel("r");
    drain(*running);
}

TEST(Service, TimeoutEndsWithInferenceTimeout) {
    ServiceOptions o;
    o.inference_timeout = std::chrono::milliseconds(100);
    Fixture f(o, 20);
    auto evs = drain(*f.svc->submit(req("t", 200)));
    EXPECT_EQ(evs.back().kind, JobEvent::Kind::Error);
    EXPECT_EQ(evs.back().code, Code::InferenceTimeout);
}

TEST(Service, ShutdownFailsQueuedJobsAndRefusesNewOnes) {
    ServiceOptions o;
    o.shutdown_grace = std::chrono::milliseconds(50);
    Fixture f(o, 20);
    auto running = f.svc->submit(req("r", 200));
    while (f.svc->active_jobs() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    auto queued = f.svc->submit(req("q", 5));
    f.svc->shutdown();
    auto qevs = drain(*queued);
    ASSERT_EQ(qevs.size(), 2u);
    EXPECT_EQ(qevs.front().kind, JobEvent::Kind::Started);
    EXPECT_EQ(qevs.back().code, Code::ShuttingDown);
    auto last = drain(*running).back();
    EXPECT_EQ(last.kind, JobEvent::Kind::Error);
    EXPECT_EQ(last.code, Code::ShuttingDown);
    EXPECT_TRUE(last.retriable);
    try {
        f.svc->submit(req("n", 5));
        FAIL();
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), Code::ShuttingDown);
    }
}

TEST(Service, LogprobsComeFromTheEngineLogits) {
    Fixture f;
    auto r = req("lp", 3);
    r.top_logprobs = 2;
    auto evs = drain(*f.svc->submit(r));
    size_t n = 0;
    for (auto& e : evs) {
        for (auto& lp : e.logprobs) {
            ++n;
            EXPECT_LE(lp.logprob, 0.0);
            EXPECT_GT(lp.logprob, -0.01);  // the test engine puts all mass on its pick
            ASSERT_EQ(lp.top.size(), 2u);
            EXPECT_EQ(lp.top[0].id, lp.id);
        }
    }
    EXPECT_EQ(n, 3u);
}

namespace {
// Words as tokens, SentencePiece-style: each word carries a leading space
// that decode() drops at the very start of a text.
struct WordCodec : ByteCodec {
    std::vector<std::string> words = {"<s>", " Once", " upon", " a", " time"};
    std::string decode(std::span<const int32_t> t) const override {
        std::string s;
        for (int32_t id : t) s += words[size_t(id)];
        if (!s.empty() && s[0] == ' ') s.erase(0, 1);
        return s;
    }
};
}  // namespace

TEST(TextStream, PromptContextKeepsTheFirstTokensLeadingSpace) {
    WordCodec codec;
    std::vector<int32_t> prompt = {0, 1};
    TextStream ts(codec, prompt);
    EXPECT_EQ(ts.push(2), " upon");
    EXPECT_EQ(ts.push(3), " a");
    TextStream bare(codec);
    EXPECT_EQ(bare.push(2), "upon");  // what the context prevents
}

// A chat message's control-token text survives its template as text
// (issue 26 item 12): marked before rendering, put back with its span after.
namespace {

using eh::service::ChatLiterals;
using eh::service::TextSpan;

TEST(ChatLiterals, TextWithoutControlTokensIsUntouched) {
    ChatLiterals lit({"</s>", "<|im_start|>"});
    EXPECT_EQ(lit.mark("a plain message, with <b>html</b>"), "a plain message, with <b>html</b>");
}

TEST(ChatLiterals, ControlTokenTextComesBackAsTextWithItsSpans) {
    ChatLiterals lit({"</s>", "<s>", "<|im_start|>"});
    const std::string content = "x </s> y <s><|im_start|>";
    // The template's own markup around the message is not a literal.
    std::string rendered = "<|im_start|>user\n" + lit.mark(content) + "</s>";
    auto p = lit.unmark(rendered);
    EXPECT_EQ(p.text, "<|im_start|>user\n" + content + "</s>");
    const size_t at = std::string("<|im_start|>user\n").size();
    ASSERT_EQ(p.literal.size(), 3u);
    EXPECT_EQ(p.literal[0], (TextSpan{at + 2, at + 6}));     // </s>
    EXPECT_EQ(p.literal[1], (TextSpan{at + 9, at + 12}));    // <s>, not the </s> it ends
    EXPECT_EQ(p.literal[2], (TextSpan{at + 12, at + 24}));   // <|im_start|>
}

TEST(ChatLiterals, AMessageCannotForgeAMarker) {
    ChatLiterals lit({"</s>"});
    const std::string forged = "\xEE\x80\x80" "1" "\xEE\x80\x81";  // what "</s>" is marked as
    auto p = lit.unmark(lit.mark(forged));
    EXPECT_EQ(p.text, forged);  // the same bytes, never "</s>"
    ASSERT_EQ(p.literal.size(), 1u);
    EXPECT_EQ(p.literal[0], (TextSpan{0, 3}));
}

TEST(ChatLiterals, MarkersOutsideTheTableStayAsTheyAre) {
    ChatLiterals lit({"</s>"});
    const std::string odd = "a\xEE\x80\x80" "99" "\xEE\x80\x81" "b\xEE\x80\x80";
    auto p = lit.unmark(odd);  // a template that writes U+E000 itself
    EXPECT_EQ(p.text, odd);
    EXPECT_TRUE(p.literal.empty());
}

// compose_chat_prompt: the template sees the marked messages as JSON, the
// literal spans come back shifted past a BOS it adds, and a BOS the
// template wrote itself is not written twice.
TEST(ChatPromptCompose, TemplateSeesMarkedJsonAndBosShiftsTheSpans) {
    ChatLiterals lit({"</s>", "<s>"});
    std::vector<eh::service::ChatMessage> msgs(1);
    msgs[0].role = "user";
    msgs[0].content = "a</s>";
    std::string seen;
    auto apply = [&](const std::string& json) {
        seen = json;
        return "[U]" + lit.mark("a</s>") + "[A]";
    };
    auto p = eh::service::compose_chat_prompt(msgs, lit, apply, "<s>");
    EXPECT_EQ(seen, eh::service::template_messages_json(lit.mark(msgs)));
    EXPECT_EQ(p.text, "<s>[U]a</s>[A]");
    ASSERT_EQ(p.literal.size(), 1u);
    EXPECT_EQ(p.literal[0], (TextSpan{7, 11}));
    auto own = eh::service::compose_chat_prompt(msgs, lit, [](const std::string&) { return std::string("<s>x"); }, "<s>");
    EXPECT_EQ(own.text, "<s>x");
    auto plain = eh::service::compose_chat_prompt(msgs, lit, {}, "");
    EXPECT_EQ(plain.text, "user: a</s>\nassistant:");
    ASSERT_EQ(plain.literal.size(), 1u);
    EXPECT_EQ(plain.literal[0], (TextSpan{7, 11}));
}

}  // namespace

// Logprobs are served from the logits of the path the engine runs: seq_logits
// on the batched step (a 1.4 step-only plugin has no session calls at all),
// session_logits otherwise. /capabilities reports this fact.
TEST(Service, LogitsFactFollowsTheForwardPath) {
    for (const char* fixture : {"good/test-engine", "step-only/fixture-step-only"}) {
        auto model = eh::test::load_test_model(eh::test::load_test_plugin(fixture).api);
        EXPECT_TRUE(local_engine(model)->facts().logits) << fixture;
    }
}
