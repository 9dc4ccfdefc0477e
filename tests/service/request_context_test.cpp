// A request's n_ctx and the service's device-memory figures, in process.
// The test engine runs behind a wrapped function table that behaves like a
// GPU engine's memory: every session holds kKvPerToken bytes per context
// token, and a session above kFreeTokens fails to allocate (VRAM_OOM).
#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "eh/loader/plugin_loader.hpp"
#include "eh/service/service.hpp"
#include "test_engine_model.hpp"

using namespace eh;
using namespace eh::service;
using eh::test::drain;

namespace {

constexpr uint64_t kModelBytes = 1000;
constexpr uint64_t kKvPerToken = 10;
constexpr uint32_t kFreeTokens = 3000;  // "device memory" left for sessions

struct Fake {
    std::shared_ptr<const eh_plugin_api> real;
    std::mutex mu;
    std::map<const eh_session*, uint32_t> live;  // session -> n_ctx
    int failed_creates = 0;
    uint64_t session_bytes() {
        uint64_t n = 0;
        for (auto& [s, ctx] : live) n += ctx * kKvPerToken;
        return n;
    }
};
Fake g_fake;

eh_status fake_get_info(const eh_model* m, eh_model_info* out) {
    eh_status st = g_fake.real->model_get_info(m, out);
    std::lock_guard lock(g_fake.mu);
    out->device_bytes_used = kModelBytes + g_fake.session_bytes();
    out->kv_bytes_per_token = kKvPerToken;
    return st;
}

eh_status fake_session_create(eh_model* m, const eh_session_params* p, eh_session** out) {
    {
        std::lock_guard lock(g_fake.mu);
        uint64_t held = g_fake.session_bytes() / kKvPerToken;
        if (held + p->n_ctx > kFreeTokens) {
            ++g_fake.failed_creates;
            *out = nullptr;
            return EH_VRAM_OOM;
        }
    }
    eh_status st = g_fake.real->session_create(m, p, out);
    if (st == EH_OK) {
        std::lock_guard lock(g_fake.mu);
        g_fake.live[*out] = p->n_ctx;
    }
    return st;
}

void fake_session_release(eh_session* s) {
    {
        std::lock_guard lock(g_fake.mu);
        g_fake.live.erase(s);
    }
    g_fake.real->session_release(s);
}

// The plugin's own message after a failed call on a model; ours has none.
const char* fake_model_last_error(const eh_model*) { return "cudaMalloc failed: out of memory"; }

struct Fixture {
    std::shared_ptr<EngineModel> model;
    std::shared_ptr<Service> svc;
    explicit Fixture(uint32_t n_ctx) {
        unsetenv("EH_TEST_ENGINE_DELAY_MS");
        PluginRecord r = eh::test::load_test_plugin("good/test-engine");
        g_fake.real = r.api;
        static eh_plugin_api table;
        table = *r.api;
        table.model_get_info = fake_get_info;
        table.session_create = fake_session_create;
        table.session_release = fake_session_release;
        table.model_last_error = fake_model_last_error;
        // Aliasing: the wrapped table keeps the real library loaded.
        std::shared_ptr<const eh_plugin_api> api(r.api, &table);
        model = eh::test::load_test_model(api);  // trained context: 4096
        ServiceOptions opt;
        opt.n_ctx = n_ctx;
        svc = std::make_shared<Service>(model, std::make_shared<ByteCodec>(), opt);
    }
};

GenerationRequest req(const std::string& id, uint32_t max_tokens, std::optional<uint32_t> n_ctx = {}) {
    GenerationRequest r;
    r.job_id = id;
    r.prompt = "hello";
    r.max_tokens = max_tokens;
    r.n_ctx = n_ctx;
    r.sampling.temperature = 0;
    r.sampling.seed = 7;
    return r;
}

}  // namespace

TEST(RequestContext, DeviceBytesCountTheServersSessionOnceItExists) {
    Fixture f(256);
    EXPECT_EQ(f.svc->model_device_bytes(), kModelBytes);
    EXPECT_EQ(f.svc->kv_bytes_per_token(), kKvPerToken);
    EXPECT_EQ(f.svc->device_bytes_used(), kModelBytes + 256 * kKvPerToken);
}

// Every sequence lives in the server's one KV-cache pool, sized at start:
// a request may not ask for more context than the server runs with.
TEST(RequestContext, ALargerContextThanTheServersIsRefusedNamingTheFlag) {
    Fixture f(16);
    EXPECT_THROW(f.svc->submit(req("small", 100)), RequestError);
    try {
        f.svc->submit(req("big", 100, 1000));
        FAIL();
    } catch (const RequestError& e) {
        EXPECT_EQ(e.field(), "n_ctx");
        const std::string m = e.what();
        EXPECT_NE(m.find("16 tokens"), std::string::npos) << m;
        EXPECT_NE(m.find("--ctx-size"), std::string::npos) << m;
    }
    EXPECT_EQ(f.svc->device_bytes_used(), kModelBytes + 16 * kKvPerToken);
    std::lock_guard lock(g_fake.mu);
    EXPECT_EQ(g_fake.live.size(), 1u);
}

TEST(RequestContext, BeyondTheTrainedContextIsRejectedAndSmallerUsesTheServersSession) {
    Fixture f(256);
    try {
        f.svc->submit(req("x", 8, 5000));  // the test engine's trained context is 4096
        FAIL();
    } catch (const RequestError& e) {
        EXPECT_EQ(e.field(), "n_ctx");
        EXPECT_NE(std::string(e.what()).find("4096"), std::string::npos) << e.what();
    }
    auto job = f.svc->submit(req("y", 8, 64));
    EXPECT_EQ(job->n_ctx, 256u);
    auto evs = drain(*job);
    ASSERT_FALSE(evs.empty());
    EXPECT_EQ(evs.back().kind, JobEvent::Kind::End);
    std::lock_guard lock(g_fake.mu);
    EXPECT_EQ(g_fake.live.size(), 1u) << "no second session for a smaller context";
}
