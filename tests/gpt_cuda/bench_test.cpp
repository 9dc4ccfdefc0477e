// Decode and prefill speed on a forged gpt-oss-20b-shaped MXFP4 model. Runs
// only when EH_GPT_CUDA_BENCH_MODEL names the file (forge it with
// `engine-host forge --like gpt-oss-20b-mxfp4`) or EH_GPT_CUDA_BENCH_FORGE
// names where to forge it; prints numbers, asserts only correctness.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

#include <eh/model/model_file.hpp>
#include <eh/tools/forge.hpp>

#include "../cuda/profiled_step.hpp"
#include "plugins.hpp"

using namespace gpttest;

namespace {

// The bench model's path ("" when neither variable is set), forged on first use.
std::string bench_model() {
    std::string path;
    if (const char* p = std::getenv("EH_GPT_CUDA_BENCH_MODEL")) path = p;
    if (path.empty()) {
        const char* dir = std::getenv("EH_GPT_CUDA_BENCH_FORGE");
        if (!dir) return path;
        // EH_GPT_CUDA_BENCH_PROFILE: another MoE profile (qwen3-30b-a3b-q4_k_m)
        const char* prof = std::getenv("EH_GPT_CUDA_BENCH_PROFILE");
        const std::string profile = prof && *prof ? prof : "gpt-oss-20b-mxfp4";
        path = std::string(dir) + "/" + profile + ".gguf";
        if (!std::filesystem::exists(path)) {
            const auto t0 = std::chrono::steady_clock::now();
            eh::tools::ForgeOptions o;
            o.profile = profile;
            o.out = path;
            o.seed = 1;
            o.vocab = "none";
            eh::tools::forge(o);
            std::printf("forged %s in %.1f s\n", path.c_str(),
                        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
    }
    return path;
}

}  // namespace

TEST(GptCudaBench, GptOss20bDecodeAndPrefill) {
    const std::string path = bench_model();
    if (path.empty()) GTEST_SKIP() << "set EH_GPT_CUDA_BENCH_MODEL or EH_GPT_CUDA_BENCH_FORGE";
    ASSERT_NE(gpu_api(), nullptr);
    // EH_GPT_CUDA_BENCH_PROMPT: the prompt's length (default 512), for decode at depth
    const char* pl = std::getenv("EH_GPT_CUDA_BENCH_PROMPT");
    const int plen = pl && std::atoi(pl) > 0 ? std::atoi(pl) : 512;
    auto file = eh::model::ModelFile::open(path);
    const auto t0 = std::chrono::steady_clock::now();
    // one sequence, its prompt in one step (as a 512-token prefill chunk)
    Engine gpu(gpu_api(), &file->view(), uint32_t(plen + 512), uint32_t(std::max(plen, 512)));
    ASSERT_TRUE(gpu.ok()) << gpu.failure;
    gpu.flags = EH_STEP_SAMPLE;  // as the server's steps: no logits kept
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    eh_model_info info{};
    info.struct_size = sizeof info;
    ASSERT_EQ(gpu.api->model_get_info(gpu.model, &info), EH_OK);
    int32_t resident = 0;
    EXPECT_EQ(gpu.api->model_check_residency(gpu.model, &resident), EH_OK);
    EXPECT_EQ(resident, 1);
    std::printf("loaded (with kv_init) in %.1f s: quant %s, %.2f GB on %s\n", load_s, info.quant_kind,
                double(info.device_bytes_used) / 1e9, info.device_name);

    std::mt19937 rng(3);
    std::vector<int32_t> prompt(static_cast<size_t>(plen));
    for (auto& t : prompt) t = int32_t(rng() % info.vocab_size);
    auto clock = [] { return std::chrono::steady_clock::now(); };
    // prefill: a warm-up prompt first (the model's first step pays
    // first-use costs: module loading, cuBLAS setup), then the timed one on
    // the emptied sequence
    ASSERT_EQ(gpu.StepSeq::prefill(prompt), EH_OK) << gpu.error();
    ASSERT_EQ(gpu.reset(), EH_OK) << gpu.error();
    const ehtest::ProfiledStep profiled;
    auto a = clock();
    profiled.begin(2000);  // EH_BENCH_PROFILE_STEP=2000: the timed prefill
    int32_t t = 0;
    ASSERT_EQ(gpu.StepSeq::prefill(prompt, &t), EH_OK) << gpu.error();
    profiled.end(2000);
    const double pp = std::chrono::duration<double>(clock() - a).count();
    for (int i = 0; i < 4; ++i) ASSERT_EQ(gpu.StepSeq::decode(t, &t), EH_OK) << gpu.error();  // graph capture
    const int n = 128;
    a = clock();
    for (int i = 0; i < n; ++i) {
        profiled.begin(i);  // EH_BENCH_PROFILE_STEP=i: decode step i
        ASSERT_EQ(gpu.StepSeq::decode(t, &t), EH_OK) << gpu.error();
        profiled.end(i);
    }
    const double tg = std::chrono::duration<double>(clock() - a).count();
    std::printf("%s: pp%d %.0f tokens/s, decode %.1f tokens/s (%d tokens at context ~%d)\n", info.architecture, plen,
                plen / pp, n / tg, n, plen + 4);
}

// The batched step's own cost (ABI 1.2, no host): `batch` sequences with a
// 128-token prompt each (one step), then 64 decode steps of all of them,
// timed per step on the host clock (one sequence's pp512 and tg128:
// GptOss20bDecodeAndPrefill). EH_BENCH_BATCHES ("1,4") picks the batch
// sizes.
TEST(GptCudaBench, GptOss20bBatchedStep) {
    const std::string path = bench_model();
    // The printed label names the model benched (EH_GPT_CUDA_BENCH_PROFILE may pick another).
    const std::string label = std::filesystem::path(path).stem().string();
    if (path.empty()) GTEST_SKIP() << "set EH_GPT_CUDA_BENCH_MODEL or EH_GPT_CUDA_BENCH_FORGE";
    const eh_plugin_api* api = gpu_api();
    ASSERT_NE(api, nullptr);
    ASSERT_NE(api->step, nullptr);
    auto file = eh::model::ModelFile::open(path);
    eh_load_params lp{};
    lp.struct_size = sizeof lp;
    lp.path = path.c_str();
    lp.view = &file->view();
    eh_model* m = nullptr;
    ASSERT_EQ(api->model_load(&lp, &m), EH_OK) << api->plugin_last_error();
    eh_kv_params kp{};
    kp.struct_size = sizeof kp;
    kp.max_seqs = 80;
    kp.max_step_tokens = 8192;
    kp.max_step_entries = 80;
    kp.max_seq_tokens = 1024;
    kp.budget_bytes = 8ull << 30;
    eh_kv_info ki{};
    ki.struct_size = sizeof ki;
    auto clock = [] { return std::chrono::steady_clock::now(); };
    auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
    auto t0 = clock();
    ASSERT_EQ(api->kv_init(m, &kp, &ki), EH_OK) << api->model_last_error(m);
    std::printf("[bench] %s batched: kv_init (pool + warm-up) %.2f s, %u blocks\n", label.c_str(), secs(t0, clock()),
                ki.total_blocks);
    const eh_sampling_params sp = ehp::greedy_sampling();
    auto entry = [](eh_seq* s, const int32_t* t, uint32_t n) { return ehtest::step_entry(s, t, n, EH_STEP_SAMPLE); };
    eh_model_info info{};
    info.struct_size = sizeof info;
    ASSERT_EQ(api->model_get_info(m, &info), EH_OK);
    std::mt19937 rng(3);
    std::vector<int32_t> prompt(384);  // (any MoE model the plugin serves: ids below its vocabulary)
    for (auto& t : prompt) t = int32_t(rng() % info.vocab_size);
    std::vector<int> batches = {1, 2, 4, 8, 16, 32, 64};
    if (const char* e = std::getenv("EH_BENCH_BATCHES")) {
        batches.clear();
        for (const char* p = e; *p;) {
            batches.push_back(std::atoi(p));
            while (*p && *p != ',') ++p;
            if (*p == ',') ++p;
        }
    }
    const ehtest::ProfiledStep profiled;
    for (int batch : batches) {
        std::vector<eh_seq*> seqs(static_cast<size_t>(batch), nullptr);
        std::vector<eh_step_entry> es(static_cast<size_t>(batch));
        std::vector<int32_t> next(static_cast<size_t>(batch));
        for (int i = 0; i < batch; ++i) {
            ASSERT_EQ(api->seq_create(m, &seqs[size_t(i)]), EH_OK) << api->model_last_error(m);
            api->seq_set_sampling(seqs[size_t(i)], &sp);
            es[size_t(i)] = entry(seqs[size_t(i)], prompt.data() + i % 4 * 64, 128);
        }
        t0 = clock();
        ASSERT_EQ(api->step(m, es.data(), uint32_t(batch)), EH_OK) << api->model_last_error(m);
        const double prefill_s = secs(t0, clock());
        double decode_s = 0;
        const int steps = 64;
        for (int k = 0; k < steps + 2; ++k) {
            for (int i = 0; i < batch; ++i) {
                next[size_t(i)] = es[size_t(i)].token;
                es[size_t(i)] = entry(seqs[size_t(i)], &next[size_t(i)], 1);
            }
            t0 = clock();
            profiled.begin(k);
            ASSERT_EQ(api->step(m, es.data(), uint32_t(batch)), EH_OK) << api->model_last_error(m);
            profiled.end(k);
            if (k >= 2) decode_s += secs(t0, clock());
        }
        std::printf("[bench] %s batched: batch %2d: prefill %d x 128 tokens %.1f ms; decode %.3f ms/step = "
                    "%.0f tokens/s\n", label.c_str(), batch, batch, prefill_s * 1e3, decode_s / steps * 1e3, batch * steps / decode_s);
        // What a server under load runs: the running sequences' decodes with
        // a few arriving requests' prompts in the same step (4 new
        // sequences of 32 tokens, the shape of loadgen's short prompts).
        if (batch >= 16) {
            constexpr int kArrivals = 4, kPromptTokens = 32, kRounds = 8;
            double mixed_s = 0;
            for (int r = 0; r < kRounds + 1; ++r) {
                std::vector<eh_step_entry> all;
                for (int i = 0; i < batch; ++i) {
                    next[size_t(i)] = es[size_t(i)].token;
                    es[size_t(i)] = entry(seqs[size_t(i)], &next[size_t(i)], 1);
                    all.push_back(es[size_t(i)]);
                }
                std::vector<eh_seq*> fresh(kArrivals, nullptr);
                for (int j = 0; j < kArrivals; ++j) {
                    ASSERT_EQ(api->seq_create(m, &fresh[size_t(j)]), EH_OK) << api->model_last_error(m);
                    api->seq_set_sampling(fresh[size_t(j)], &sp);
                    all.push_back(entry(fresh[size_t(j)], prompt.data() + 128 + 32 * ((r + j) % 8), kPromptTokens));
                }
                t0 = clock();
                profiled.begin(1000 + r);  // EH_BENCH_PROFILE_STEP=1000+r: mixed round r
                ASSERT_EQ(api->step(m, all.data(), uint32_t(all.size())), EH_OK) << api->model_last_error(m);
                profiled.end(1000 + r);
                if (r > 0) mixed_s += secs(t0, clock());
                for (int i = 0; i < batch; ++i) es[size_t(i)].token = all[size_t(i)].token;
                for (eh_seq* q : fresh) api->seq_release(q);
            }
            std::printf("[bench] %s batched: batch %2d + %d x %d-token prompts: %.3f ms/step\n", label.c_str(), batch,
                        kArrivals, kPromptTokens, mixed_s / kRounds * 1e3);
        }
        for (eh_seq* q : seqs) api->seq_release(q);
    }
    api->model_release(m);
}
