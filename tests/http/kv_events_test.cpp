// serve --kv-events-endpoint against a real server: the CPU reference engine
// on the shipped model, a ZeroMQ subscriber decoding every batch (vLLM's
// format, as llm-d's indexer reads it): a prompt's full blocks stored with
// their token ids and chained parents, removals on eviction, the replay
// socket, contiguous sequence numbers under 64 clients, AllBlocksCleared at
// shutdown and when the engine process dies, and the flags' errors.
#include <gtest/gtest.h>
#include <zmq.h>

#include <msgpack.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>

#include "eh/service/kv_events.hpp"
#include "engine_host_process.hpp"

using namespace eh::test;
using nlohmann::json;

namespace {

const std::string kModel = EH_DEFAULT_MODEL;
constexpr uint32_t kBlock = 16;  // the CPU reference engine's KV block

std::string unique_ipc(const std::string& what) {
    std::random_device rd;
    return "ipc://" + (std::filesystem::temp_directory_path() / ("eh-kv-" + what + "-" + std::to_string(rd()))).string();
}

// A msgpack object as JSON (unsigned integers stay exact).
json to_json(const msgpack::object& o) {
    switch (o.type) {
    case msgpack::type::NIL: return nullptr;
    case msgpack::type::BOOLEAN: return o.via.boolean;
    case msgpack::type::POSITIVE_INTEGER: return o.via.u64;
    case msgpack::type::NEGATIVE_INTEGER: return o.via.i64;
    case msgpack::type::FLOAT32: case msgpack::type::FLOAT64: return o.via.f64;
    case msgpack::type::STR: return std::string(o.via.str.ptr, o.via.str.size);
    case msgpack::type::ARRAY: {
        json a = json::array();
        for (uint32_t i = 0; i < o.via.array.size; ++i) a.push_back(to_json(o.via.array.ptr[i]));
        return a;
    }
    default: return "(unexpected msgpack type " + std::to_string(int(o.type)) + ")";
    }
}

uint64_t be64(const std::string& s) {
    uint64_t v = 0;
    for (unsigned char c : s) v = (v << 8) | c;
    return v;
}

struct Message {
    std::string topic;
    uint64_t seq = 0;
    std::string payload;
    json batch;  // [ts, events, data_parallel_rank]
};

std::vector<std::string> recv_frames(void* sock, int timeout_ms) {
    zmq_pollitem_t item{sock, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, timeout_ms) <= 0) return {};
    std::vector<std::string> frames;
    int more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, 0) < 0) {
            zmq_msg_close(&m);
            break;
        }
        frames.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
        more = zmq_msg_more(&m);
        zmq_msg_close(&m);
    }
    return frames;
}

json decode(const std::string& payload) {
    msgpack::object_handle oh = msgpack::unpack(payload.data(), payload.size());
    return to_json(oh.get());
}

class Subscriber {
public:
    explicit Subscriber(const std::string& endpoint) {
        ctx_ = zmq_ctx_new();
        sub_ = zmq_socket(ctx_, ZMQ_SUB);
        zmq_setsockopt(sub_, ZMQ_SUBSCRIBE, "", 0);
        EXPECT_EQ(zmq_connect(sub_, endpoint.c_str()), 0) << endpoint;
    }
    ~Subscriber() {
        const int zero = 0;
        zmq_setsockopt(sub_, ZMQ_LINGER, &zero, sizeof zero);
        zmq_close(sub_);
        zmq_ctx_term(ctx_);
    }
    // The next message, or nullopt after `timeout_ms` without one.
    std::optional<Message> next(int timeout_ms = 5000) {
        std::vector<std::string> f = recv_frames(sub_, timeout_ms);
        if (f.empty()) return std::nullopt;
        EXPECT_EQ(f.size(), 3u);
        if (f.size() != 3) return std::nullopt;
        EXPECT_EQ(f[1].size(), 8u);
        Message m{f[0], be64(f[1]), f[2], decode(f[2])};
        all.push_back(m);
        return m;
    }
    // Messages until none comes for `quiet_ms`.
    void drain(int quiet_ms = 1500) {
        while (next(quiet_ms)) {
        }
    }
    std::vector<Message> all;

private:
    void* ctx_;
    void* sub_;
};

// Every event of the messages received so far, in order.
std::vector<json> events_of(const std::vector<Message>& ms) {
    std::vector<json> out;
    for (const auto& m : ms)
        for (const auto& e : m.batch[1]) out.push_back(e);
    return out;
}

std::vector<int32_t> tokenize(EngineHost& h, const std::string& text) {
    json j = json::parse(h.post("/tokenize", json{{"text", text}, {"add_special", true}}.dump()).body);
    return j["tokens"].get<std::vector<int32_t>>();
}

json complete(EngineHost& h, const std::string& prompt, int max_tokens) {
    HttpResponse r = h.post("/v1/completions",
                            json{{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}}.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body, nullptr, false);
}

const std::string kPromptA =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the garden with her "
    "friend, a small brown dog named Max. One day they found a shiny red ball under a big tree.";
const std::string kPromptB =
    "Tom was a brave boy who lived near the sea. Every morning he walked to the beach to look for shells, and one "
    "day he found a tiny crab that could not find its way home.";

EngineHost kv_server(const std::string& pub, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--served-model-name", "tales", "--kv-events-endpoint", pub};
    for (auto& a : extra) args.push_back(a);
    return EngineHost(args, {}, true, EH_PLUGIN_DIR, kModel);
}

// One cached sequence at a time (--parallel 1: the engine holds two
// sequences, one running, one cached):
// a prompt's blocks are stored with its tokens and chained hashes, a second
// prompt sharing its first blocks stores only the rest (parented on the
// shared block) and evicts the first's own blocks, and replay answers from
// a sequence number.
TEST(KvEvents, BlocksStoredWithTokensAndParentsRemovedOnEvictionAndReplayed) {
    const std::string pub = unique_ipc("pub"), replay = unique_ipc("replay");
    EngineHost h = kv_server(pub, {"--parallel", "1", "--kv-events-replay-endpoint", replay});
    ASSERT_GT(h.port(), 0);
    Subscriber sub(pub);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the subscription reaches the publisher

    const std::vector<int32_t> a = tokenize(h, kPromptA);
    ASSERT_GE(a.size(), 3 * kBlock);
    json ra = complete(h, kPromptA, 6);
    auto m1 = sub.next();
    ASSERT_TRUE(m1);
    EXPECT_EQ(m1->topic, "kv@127.0.0.1:" + std::to_string(h.port()) + "@tales");
    EXPECT_EQ(m1->seq, 0u);
    ASSERT_EQ(m1->batch.size(), 3u) << m1->batch;
    EXPECT_TRUE(m1->batch[0].is_number_float());
    EXPECT_EQ(m1->batch[2], 0);  // data_parallel_rank
    ASSERT_EQ(m1->batch[1].size(), 1u);
    const json& s1 = m1->batch[1][0];
    ASSERT_EQ(s1.size(), 8u) << s1;
    EXPECT_EQ(s1[0], "BlockStored");
    EXPECT_TRUE(s1[2].is_null()) << "the first block has no parent";
    EXPECT_EQ(s1[4], kBlock);
    EXPECT_TRUE(s1[5].is_null());
    EXPECT_EQ(s1[6], "CPU");
    // The cached sequence: the prompt and all but the last generated token.
    const size_t cached = a.size() + ra["usage"]["completion_tokens"].get<size_t>() - 1;
    const std::vector<uint64_t> h1 = s1[1].get<std::vector<uint64_t>>();
    const std::vector<int32_t> t1 = s1[3].get<std::vector<int32_t>>();
    ASSERT_EQ(h1.size(), cached / kBlock) << "every full block of the cached sequence";
    ASSERT_EQ(t1.size(), h1.size() * kBlock);
    EXPECT_EQ(std::vector<int32_t>(t1.begin(), t1.begin() + long(a.size() / kBlock * kBlock)),
              std::vector<int32_t>(a.begin(), a.begin() + long(a.size() / kBlock * kBlock)));
    uint64_t parent = eh::service::kv_root_hash("");
    for (size_t i = 0; i < h1.size(); ++i) {
        parent = eh::service::kv_block_hash(parent, std::span(t1).subspan(i * kBlock, kBlock));
        EXPECT_EQ(h1[i], parent) << "block " << i;
    }

    // The same first sentence, then other words: the shared full blocks
    // stay, the new ones are parented on the last shared one, and the first
    // sequence's own blocks are evicted with it (one cached sequence).
    const std::string prompt_c = kPromptA.substr(0, kPromptA.find("One day")) +
                                 "Then it started to rain, so Lily and Max ran inside to drink warm milk by the fire.";
    const std::vector<int32_t> c = tokenize(h, prompt_c);
    size_t common = 0;
    while (common < std::min(a.size(), c.size()) && a[common] == c[common]) ++common;
    const size_t shared_blocks = common / kBlock;
    ASSERT_GE(shared_blocks, 1u);
    complete(h, prompt_c, 6);
    sub.drain();
    const std::vector<json> ev = events_of(sub.all);
    ASSERT_GE(ev.size(), 3u);
    const json& s2 = ev[1];
    ASSERT_EQ(s2[0], "BlockStored") << s2;
    EXPECT_EQ(s2[2], h1[shared_blocks - 1]) << "parent: the last block both prompts share";
    const std::vector<int32_t> t2 = s2[3].get<std::vector<int32_t>>();
    EXPECT_EQ(std::vector<int32_t>(t2.begin(), t2.begin() + kBlock),
              std::vector<int32_t>(c.begin() + long(shared_blocks * kBlock), c.begin() + long((shared_blocks + 1) * kBlock)));
    const json& r1 = ev[2];
    ASSERT_EQ(r1[0], "BlockRemoved") << r1;
    std::vector<uint64_t> removed = r1[1].get<std::vector<uint64_t>>();
    std::vector<uint64_t> own(h1.begin() + long(shared_blocks), h1.end());
    std::sort(removed.begin(), removed.end());
    std::sort(own.begin(), own.end());
    EXPECT_EQ(removed, own) << "the first sequence's blocks past the shared ones";
    EXPECT_EQ(r1[2], "CPU");

    // Replay from sequence 1: the same batches, then the end marker.
    void* ctx = zmq_ctx_new();
    void* req = zmq_socket(ctx, ZMQ_DEALER);
    ASSERT_EQ(zmq_connect(req, replay.c_str()), 0);
    const std::string start = std::string(7, '\0') + '\x01';
    zmq_send(req, "", 0, ZMQ_SNDMORE);
    zmq_send(req, start.data(), start.size(), 0);
    std::vector<std::pair<uint64_t, std::string>> replayed;
    for (;;) {
        std::vector<std::string> f = recv_frames(req, 5000);
        ASSERT_EQ(f.size(), 3u) << "[empty, seq, payload]";
        if (f[1] == std::string(8, '\xFF')) {
            EXPECT_TRUE(f[2].empty());
            break;
        }
        replayed.emplace_back(be64(f[1]), f[2]);
    }
    ASSERT_EQ(replayed.size(), sub.all.size() - 1);
    for (size_t i = 0; i < replayed.size(); ++i) {
        EXPECT_EQ(replayed[i].first, sub.all[i + 1].seq);
        EXPECT_EQ(replayed[i].second, sub.all[i + 1].payload);
    }
    // A request that is not an 8-byte sequence number: just the end marker.
    zmq_send(req, "", 0, ZMQ_SNDMORE);
    zmq_send(req, "abc", 3, 0);
    std::vector<std::string> f = recv_frames(req, 5000);
    ASSERT_EQ(f.size(), 3u);
    EXPECT_EQ(f[1], std::string(8, '\xFF'));
    const int zero = 0;
    zmq_setsockopt(req, ZMQ_LINGER, &zero, sizeof zero);
    zmq_close(req);
    zmq_ctx_term(ctx);

    // Shutdown empties the cache: every block still held, then AllBlocksCleared.
    EXPECT_EQ(h.stop(), 0);
    sub.drain(1000);
    const json& last = sub.all.back().batch[1];
    ASSERT_EQ(last.size(), 2u) << last;
    EXPECT_EQ(last[0][0], "BlockRemoved");
    EXPECT_EQ(last[1], json::array({"AllBlocksCleared"}));
}

// 64 clients at once, each its own prompt: every batch arrives, numbered
// 0, 1, 2, ... with no gap, and every request's blocks were stored.
TEST(KvEvents, SixtyFourClientsGiveContiguousSequenceNumbers) {
    const std::string pub = unique_ipc("pub");
    EngineHost h = kv_server(pub, {"--parallel", "64"});  // 64 running, 64 cached
    ASSERT_GT(h.port(), 0);
    Subscriber sub(pub);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::vector<std::thread> clients;
    std::atomic<int> ok{0};
    std::mutex mu;
    std::string failure;
    for (int i = 0; i < 64; ++i)
        clients.emplace_back([&, i] {
            // About 20 tokens and one out: one full block each (64 long
            // prompts, or decode steps of 64 sequences, take the CPU engine
            // on two cores longer than the client waits).
            const std::string p = "Story number " + std::to_string(i) + ". Tom was a brave boy who lived near the sea.";
            HttpResponse r = h.post("/v1/completions", json{{"prompt", p}, {"max_tokens", 1}, {"temperature", 0}}.dump());
            if (r.status == 200) ++ok;
            std::lock_guard lock(mu);
            if (r.status != 200 && failure.empty()) failure = std::to_string(r.status) + " " + r.body;
        });
    for (auto& t : clients) t.join();
    EXPECT_EQ(ok.load(), 64) << failure;
    sub.drain();
    ASSERT_FALSE(sub.all.empty());
    for (size_t i = 0; i < sub.all.size(); ++i) ASSERT_EQ(sub.all[i].seq, i) << "a gap before message " << i;
    // Each prompt differs in its first block: 64 sequences' first blocks stored.
    size_t first_blocks = 0;
    for (const auto& e : events_of(sub.all))
        if (e[0] == "BlockStored" && e[2].is_null()) ++first_blocks;
    EXPECT_EQ(first_blocks, 64u);
}

// The engine process dies and takes every cached sequence with it: the
// blocks it held are removed and AllBlocksCleared follows, before the
// restarted engine stores anything again.
TEST(KvEvents, AnEngineThatDiesClearsEveryBlock) {
    const std::string pub = unique_ipc("pub");
    EngineHost h = kv_server(pub, {"--parallel", "1", "--engine-process"});
    ASSERT_GT(h.port(), 0);
    Subscriber sub(pub);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    complete(h, kPromptA, 4);
    auto stored = sub.next();
    ASSERT_TRUE(stored);
    ASSERT_EQ(stored->batch[1][0][0], "BlockStored");
    const size_t held = stored->batch[1][0][1].size();
    const json health = json::parse(h.get("/health").body);
    const int child = health["engine"]["process"].get<int>();
    ASSERT_GT(child, 0);
    ASSERT_EQ(kill(child, SIGKILL), 0);
    auto cleared = sub.next(10000);
    ASSERT_TRUE(cleared);
    const json& ev = cleared->batch[1];
    ASSERT_EQ(ev.size(), 2u) << ev;
    EXPECT_EQ(ev[0][0], "BlockRemoved");
    EXPECT_EQ(ev[0][1].size(), held);
    EXPECT_EQ(ev[1], json::array({"AllBlocksCleared"}));
    EXPECT_EQ(cleared->seq, stored->seq + 1);
    // Served again by the restarted engine, its blocks stored anew.
    ASSERT_TRUE([&] {
        for (int i = 0; i < 500; ++i) {
            if (json::parse(h.get("/health").body).value("status", "") == "healthy") return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        return false;
    }());
    complete(h, kPromptA, 4);
    auto again = sub.next();
    ASSERT_TRUE(again);
    EXPECT_EQ(again->batch[1][0][0], "BlockStored");
    EXPECT_EQ(again->batch[1][0][1], stored->batch[1][0][1]) << "the same tokens, the same hashes";
}

TEST(KvEvents, FlagErrorsAreUsageErrors) {
    const std::string base = std::string(EH_ENGINE_HOST) + " --model " + kModel + " --plugins " + EH_PLUGIN_DIR +
                             " --device cpu --port 0 ";
    auto [st1, out1] = run_command(base + "--kv-events-endpoint nonsense 2>&1");
    EXPECT_EQ(WEXITSTATUS(st1), 2) << out1;
    EXPECT_NE(out1.find("--kv-events-endpoint nonsense: cannot connect to it"), std::string::npos) << out1;
    auto [st2, out2] = run_command(base + "--kv-events-topic x 2>&1");
    EXPECT_EQ(WEXITSTATUS(st2), 2) << out2;
    EXPECT_NE(out2.find("need --kv-events-endpoint"), std::string::npos) << out2;
    auto [st3, out3] = run_command(base + "--kv-events-endpoint tcp://*:1 --no-prefix-cache 2>&1");
    EXPECT_EQ(WEXITSTATUS(st3), 2) << out3;
    // An endpoint another server holds: exit 1, naming it.
    void* ctx = zmq_ctx_new();
    void* taken = zmq_socket(ctx, ZMQ_PUB);
    ASSERT_EQ(zmq_bind(taken, "tcp://*:*"), 0);
    char ep[256];
    size_t len = sizeof ep;
    zmq_getsockopt(taken, ZMQ_LAST_ENDPOINT, ep, &len);
    std::string bound(ep);
    const std::string port = bound.substr(bound.rfind(':') + 1);
    auto [st4, out4] = run_command(base + "--kv-events-endpoint 'tcp://*:" + port + "' 2>&1");
    EXPECT_EQ(WEXITSTATUS(st4), 1) << out4;
    EXPECT_NE(out4.find("cannot bind it"), std::string::npos) << out4;
    zmq_close(taken);
    zmq_ctx_term(ctx);
}

}  // namespace
