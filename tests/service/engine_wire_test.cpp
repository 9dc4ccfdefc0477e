// The engine process's protocol (host/service/src/engine_wire.cpp): what
// goes in comes out, and a truncated, oversized, lying or unknown message is
// a ProtocolError, never a crash or a read past its end (the ASan build
// checks the latter).
#include <gtest/gtest.h>

#include <cstring>

#include "engine_wire.hpp"

using namespace eh;
using namespace eh::service;
using namespace eh::service::wire;

namespace {

std::vector<uint8_t> body(const std::vector<uint8_t>& frame) {
    EXPECT_GE(frame.size(), 4u);
    EXPECT_EQ(frame_length(frame.data()), frame.size() - 4);
    return {frame.begin() + 4, frame.end()};
}

template <class T>
void put_at(std::vector<uint8_t>& b, size_t at, T v) {
    std::memcpy(b.data() + at, &v, sizeof v);
}

std::vector<uint8_t> a_step() {
    static const std::vector<int32_t> t1 = {5, 6, 7}, t2 = {9};
    static const std::vector<uint32_t> mask = {0xffffffffu, 0x1u};
    static const std::vector<std::pair<int32_t, float>> bias = {{3, 1.5f}, {4, -2.0f}};
    std::vector<StepItem> items(2);
    items[0].seq = 11;
    items[0].tokens = t1;
    items[1].seq = 12;
    items[1].tokens = t2;
    items[1].sample = true;
    items[1].logits = true;
    items[1].allowed = &mask;
    items[1].bias = &bias;
    items[1].verify = true;
    return body(encode_step(items));
}

Reply a_step_reply() {
    Reply r;
    r.type = Msg::Step;
    r.free_blocks = 17;
    r.tokens = {-1, 42};
    r.accepted = {0, 3};
    r.logits = {{}, {0.5f, -1.0f, 3.0f}};
    return r;
}

Reply a_ready() {
    Reply r;
    r.type = Msg::Ready;
    std::strcpy(r.facts.info.architecture, "llama");
    std::strcpy(r.facts.info.quant_kind, "Q4_K_M");
    std::strcpy(r.facts.info.device_name, "test device");
    r.facts.info.context_length = 4096;
    r.facts.info.vocab_size = 32000;
    r.facts.info.device_bytes_used = 123456789;
    r.facts.info.kv_bytes_per_token = 2048;
    r.facts.info.compute_capability = 90;
    r.facts.plugin_name = "cpu-reference";
    r.facts.plugin_version = "1.2.3";
    r.facts.logits = true;
    return r;
}

}  // namespace

TEST(EngineWire, AStepRequestRoundTrips) {
    const Request q = decode_request(a_step());
    ASSERT_EQ(q.type, Msg::Step);
    ASSERT_EQ(q.entries.size(), 2u);
    EXPECT_EQ(q.entries[0].seq, 11u);
    EXPECT_EQ(q.entries[0].tokens, (std::vector<int32_t>{5, 6, 7}));
    EXPECT_FALSE(q.entries[0].sample);
    EXPECT_FALSE(q.entries[0].allowed);
    EXPECT_TRUE(q.entries[0].bias.empty());
    EXPECT_TRUE(q.entries[1].sample);
    EXPECT_TRUE(q.entries[1].logits);
    EXPECT_FALSE(q.entries[0].verify);
    EXPECT_TRUE(q.entries[1].verify);
    ASSERT_TRUE(q.entries[1].allowed);
    EXPECT_EQ(*q.entries[1].allowed, (std::vector<uint32_t>{0xffffffffu, 0x1u}));
    ASSERT_EQ(q.entries[1].bias.size(), 2u);
    EXPECT_EQ(q.entries[1].bias[1].first, 4);
    EXPECT_EQ(q.entries[1].bias[1].second, -2.0f);
}

TEST(EngineWire, TheOtherRequestsRoundTrip) {
    KvBudget b;
    b.max_seqs = 64;
    b.max_step_tokens = 2048;
    b.max_seq_tokens = 4096;
    b.budget_bytes = 1ull << 33;
    b.memory_fraction = 0.5f;
    Request q = decode_request(body(encode_kv_init(b)));
    EXPECT_EQ(q.type, Msg::KvInit);
    EXPECT_EQ(q.budget.max_seq_tokens, 4096u);
    EXPECT_EQ(q.budget.budget_bytes, 1ull << 33);
    EXPECT_EQ(q.budget.memory_fraction, 0.5f);

    eh_sampling_params p{};
    p.temperature = 0.7f;
    p.top_k = 40;
    p.top_p = 0.9f;
    p.seed = 0xdeadbeefcafeull;
    p.repetition_window = -1;
    p.frequency_penalty = 0.25f;
    q = decode_request(body(encode_set_sampling(9, p)));
    EXPECT_EQ(q.type, Msg::SetSampling);
    EXPECT_EQ(q.seq, 9u);
    EXPECT_EQ(q.sampling.struct_size, sizeof(eh_sampling_params));
    EXPECT_EQ(q.sampling.seed, p.seed);
    EXPECT_EQ(q.sampling.top_k, 40);
    EXPECT_EQ(q.sampling.repetition_window, -1);
    EXPECT_EQ(q.sampling.frequency_penalty, 0.25f);

    q = decode_request(body(encode_request(Msg::Fork, 3, 17)));
    EXPECT_EQ(q.type, Msg::Fork);
    EXPECT_EQ(q.seq, 3u);
    EXPECT_EQ(q.n, 17u);
    q = decode_request(body(encode_request(Msg::Release, 8)));
    EXPECT_EQ(q.seq, 8u);
    EXPECT_EQ(decode_request(body(encode_request(Msg::Create))).type, Msg::Create);
    // The liveness ping: no fields either way, and a byte more is refused.
    EXPECT_EQ(decode_request(body(encode_request(Msg::Ping))).type, Msg::Ping);
    EXPECT_EQ(body(encode_request(Msg::Ping)).size(), 1u);
    Reply pong;
    pong.type = Msg::Ping;
    EXPECT_EQ(decode_reply(body(encode_reply(pong))).type, Msg::Ping);
    std::vector<uint8_t> ping_longer = body(encode_request(Msg::Ping));
    ping_longer.push_back(0);
    EXPECT_THROW(decode_request(ping_longer), ProtocolError);
}

TEST(EngineWire, RepliesRoundTrip) {
    Reply r = decode_reply(body(encode_reply(a_step_reply())));
    EXPECT_EQ(r.type, Msg::Step);
    EXPECT_EQ(r.free_blocks, 17u);
    EXPECT_EQ(r.tokens, (std::vector<int32_t>{-1, 42}));
    EXPECT_EQ(r.accepted, (std::vector<uint32_t>{0, 3}));
    EXPECT_TRUE(r.logits[0].empty());
    EXPECT_EQ(r.logits[1], (std::vector<float>{0.5f, -1.0f, 3.0f}));

    r = decode_reply(body(encode_reply(a_ready())));
    EXPECT_EQ(r.type, Msg::Ready);
    EXPECT_STREQ(r.facts.info.architecture, "llama");
    EXPECT_STREQ(r.facts.info.device_name, "test device");
    EXPECT_EQ(r.facts.info.vocab_size, 32000u);
    EXPECT_EQ(r.facts.info.device_bytes_used, 123456789u);
    EXPECT_EQ(r.facts.info.kv_bytes_per_token, 2048u);
    EXPECT_EQ(r.facts.plugin_version, "1.2.3");
    EXPECT_TRUE(r.facts.logits);

    Reply e;
    e.type = Msg::Error;
    e.code = Code::ContextFull;
    e.message = "context full";
    r = decode_reply(body(encode_reply(e)));
    EXPECT_EQ(r.code, Code::ContextFull);
    EXPECT_EQ(r.message, "context full");

    Reply k;
    k.type = Msg::KvInit;
    k.limits.max_seqs = 128;
    k.limits.total_blocks = 999;
    k.limits.block_bytes = 1 << 20;
    k.limits.batched = true;
    k.limits.max_draft_tokens = 16;
    k.has_logits = true;
    k.device_bytes = 5;
    r = decode_reply(body(encode_reply(k)));
    EXPECT_EQ(r.limits.max_seqs, 128u);
    EXPECT_EQ(r.limits.total_blocks, 999u);
    EXPECT_EQ(r.limits.block_bytes, 1u << 20);
    EXPECT_TRUE(r.limits.batched);
    EXPECT_EQ(r.limits.max_draft_tokens, 16u);
    EXPECT_FALSE(r.limits.can_fork);
    EXPECT_TRUE(r.has_logits);
    EXPECT_FALSE(r.can_park);
    k.can_park = true;
    EXPECT_TRUE(decode_reply(body(encode_reply(k))).can_park);
}

// The host tier's three calls and their replies (protocol 6).
TEST(EngineWire, TheHostTierRoundTrips) {
    Request q = decode_request(body(encode_park(5, 4000, 1ull << 40)));
    EXPECT_EQ(q.type, Msg::Park);
    EXPECT_EQ(q.seq, 5u);
    EXPECT_EQ(q.n, 4000u);
    EXPECT_EQ(q.max_bytes, 1ull << 40);
    const std::vector<int32_t> tokens = {7, 8, 9, 151935};
    q = decode_request(body(encode_unpark(0x1234567890ull, tokens)));
    EXPECT_EQ(q.type, Msg::Unpark);
    EXPECT_EQ(q.parked, 0x1234567890ull);
    EXPECT_EQ(q.tokens, tokens);
    q = decode_request(body(encode_drop_parked(77)));
    EXPECT_EQ(q.type, Msg::DropParked);
    EXPECT_EQ(q.parked, 77u);

    Reply p;
    p.type = Msg::Park;
    p.parked = 3;
    p.parked_bytes = 49152000;
    p.free_blocks = 11;
    Reply r = decode_reply(body(encode_reply(p)));
    EXPECT_EQ(r.parked, 3u);
    EXPECT_EQ(r.parked_bytes, 49152000u);
    EXPECT_EQ(r.free_blocks, 11u);
    p.type = Msg::Unpark;
    p.seq = 12;
    r = decode_reply(body(encode_reply(p)));
    EXPECT_EQ(r.seq, 12u);
    EXPECT_EQ(r.free_blocks, 11u);
    p.type = Msg::DropParked;
    EXPECT_EQ(decode_reply(body(encode_reply(p))).free_blocks, 11u);
}

// Every proper prefix of every message is refused, as is one more byte.
TEST(EngineWire, TruncatedAndOverlongMessagesAreRefused) {
    const std::vector<int32_t> some = {1, 2, 3};
    std::vector<std::vector<uint8_t>> requests = {a_step(), body(encode_kv_init({})), body(encode_request(Msg::Fork, 1, 2)),
                                                  body(encode_set_sampling(1, {})), body(encode_park(1, 2, 3)),
                                                  body(encode_unpark(4, some)), body(encode_drop_parked(5))};
    for (const auto& m : requests) {
        for (size_t n = 0; n < m.size(); ++n)
            EXPECT_THROW(decode_request(std::span<const uint8_t>(m.data(), n)), ProtocolError) << n << " of " << m.size();
        std::vector<uint8_t> longer = m;
        longer.push_back(0);
        EXPECT_THROW(decode_request(longer), ProtocolError);
    }
    std::vector<std::vector<uint8_t>> replies = {body(encode_reply(a_step_reply())), body(encode_reply(a_ready()))};
    for (const auto& m : replies) {
        for (size_t n = 0; n < m.size(); ++n)
            EXPECT_THROW(decode_reply(std::span<const uint8_t>(m.data(), n)), ProtocolError) << n << " of " << m.size();
        std::vector<uint8_t> longer = m;
        longer.push_back(0);
        EXPECT_THROW(decode_reply(longer), ProtocolError);
    }
}

TEST(EngineWire, CountsThatLieAreRefusedBeforeAnyAllocation) {
    // The step's entry count, then the first entry's token count.
    std::vector<uint8_t> m = a_step();
    put_at<uint32_t>(m, 1, 0xffffffffu);
    EXPECT_THROW(decode_request(m), ProtocolError);
    put_at<uint32_t>(m, 1, 60000u);  // under the cap, over what the bytes could hold
    EXPECT_THROW(decode_request(m), ProtocolError);
    m = a_step();
    put_at<uint32_t>(m, 1 + 4 + 8 + 1, 0x3fffffffu);
    EXPECT_THROW(decode_request(m), ProtocolError);
    // A step of no entries, an entry of no tokens.
    m = a_step();
    put_at<uint32_t>(m, 1, 0u);
    EXPECT_THROW(decode_request(m), ProtocolError);

    // The reply's logits count: far past the vocabulary cap, and past the bytes.
    Reply r;
    r.type = Msg::Step;
    r.tokens = {1};
    r.logits = {{1.0f}};
    std::vector<uint8_t> b = body(encode_reply(r));
    const size_t count_at = 1 + 1 + 4 + 4 + 4 + 4;  // type, kv_full, free, n, token, accepted
    put_at<uint32_t>(b, count_at, kMaxVocab + 1);
    EXPECT_THROW(decode_reply(b), ProtocolError);
    put_at<uint32_t>(b, count_at, 1000u);
    EXPECT_THROW(decode_reply(b), ProtocolError);
    // A string longer than the message.
    Reply e;
    e.type = Msg::Error;
    e.message = "x";
    b = body(encode_reply(e));
    put_at<uint32_t>(b, 1 + 4, 1u << 20);
    EXPECT_THROW(decode_reply(b), ProtocolError);
}

TEST(EngineWire, UnknownTypesFlagsCodesAndVersionsAreRefused) {
    EXPECT_THROW(decode_request(std::vector<uint8_t>{99}), ProtocolError);
    EXPECT_THROW(decode_request(std::vector<uint8_t>{uint8_t(Msg::Ready)}), ProtocolError);  // a reply's type
    EXPECT_THROW(decode_reply(std::vector<uint8_t>{200}), ProtocolError);
    EXPECT_THROW(decode_reply(std::vector<uint8_t>{}), ProtocolError);

    std::vector<uint8_t> m = a_step();
    m[1 + 4 + 8] = 16;  // the first entry's flags
    EXPECT_THROW(decode_request(m), ProtocolError);

    Reply s = a_step_reply();
    std::vector<uint8_t> b = body(encode_reply(s));
    b[1] = 2;  // kv_full is 0 or 1
    EXPECT_THROW(decode_reply(b), ProtocolError);

    Reply e;
    e.type = Msg::Error;
    b = body(encode_reply(e));
    put_at<uint32_t>(b, 1, 1000u);  // no such error code
    EXPECT_THROW(decode_reply(b), ProtocolError);

    b = body(encode_reply(a_ready()));
    put_at<uint16_t>(b, 1 + 4, uint16_t(kVersion + 1));
    try {
        decode_reply(b);
        ADD_FAILURE() << "another protocol version was accepted";
    } catch (const ProtocolError& err) {
        EXPECT_NE(std::string(err.what()).find("protocol version"), std::string::npos) << err.what();
    }
    b = body(encode_reply(a_ready()));
    put_at<uint32_t>(b, 1, 0u);  // magic
    EXPECT_THROW(decode_reply(b), ProtocolError);
}

TEST(EngineWire, FrameLengthsAreBounded) {
    uint8_t h[4];
    uint32_t n = kMaxFrame + 1;
    std::memcpy(h, &n, 4);
    EXPECT_THROW(frame_length(h), ProtocolError);
    n = 0;
    std::memcpy(h, &n, 4);
    EXPECT_THROW(frame_length(h), ProtocolError);
    n = kMaxFrame;
    std::memcpy(h, &n, 4);
    EXPECT_EQ(frame_length(h), kMaxFrame);
}
