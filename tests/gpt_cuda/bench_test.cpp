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

#include "plugins.hpp"

using namespace gpttest;

TEST(GptCudaBench, GptOss20bDecodeAndPrefill) {
    std::string path;
    if (const char* p = std::getenv("EH_GPT_CUDA_BENCH_MODEL")) path = p;
    if (path.empty()) {
        const char* dir = std::getenv("EH_GPT_CUDA_BENCH_FORGE");
        if (!dir) GTEST_SKIP() << "set EH_GPT_CUDA_BENCH_MODEL or EH_GPT_CUDA_BENCH_FORGE";
        path = std::string(dir) + "/gpt-oss-20b-mxfp4.gguf";
        if (!std::filesystem::exists(path)) {
            const auto t0 = std::chrono::steady_clock::now();
            eh::tools::ForgeOptions o;
            o.profile = "gpt-oss-20b-mxfp4";
            o.out = path;
            o.seed = 1;
            o.vocab = "none";
            eh::tools::forge(o);
            std::printf("forged %s in %.1f s\n", path.c_str(),
                        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
    }
    ASSERT_NE(gpu_api(), nullptr);
    auto file = eh::model::ModelFile::open(path);
    const auto t0 = std::chrono::steady_clock::now();
    Engine gpu(gpu_api(), &file->view(), 1024);
    ASSERT_TRUE(gpu.ok()) << gpu.error;
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    eh_model_info info{};
    info.struct_size = sizeof info;
    ASSERT_EQ(gpu.api->model_get_info(gpu.model, &info), EH_OK);
    int32_t resident = 0;
    EXPECT_EQ(gpu.api->model_check_residency(gpu.model, &resident), EH_OK);
    EXPECT_EQ(resident, 1);
    std::printf("loaded in %.1f s: quant %s, %.2f GB on %s\n", load_s, info.quant_kind,
                double(info.device_bytes_used) / 1e9, info.device_name);

    std::mt19937 rng(3);
    std::vector<int32_t> prompt(512);
    for (auto& t : prompt) t = int32_t(rng() % 200000);
    auto clock = [] { return std::chrono::steady_clock::now(); };
    // prefill: warm once on a separate session, then time pp512
    gpu.prefill(std::vector<int32_t>(prompt.begin(), prompt.begin() + 16));
    ASSERT_EQ(gpu.api->session_reset(gpu.session), EH_OK);
    auto a = clock();
    gpu.prefill(prompt);
    const double pp = std::chrono::duration<double>(clock() - a).count();
    int32_t t = 0;
    ASSERT_EQ(gpu.api->session_sample(gpu.session, &t), EH_OK);
    for (int i = 0; i < 4; ++i) gpu.api->session_decode(gpu.session, t, &t);  // graph capture
    const int n = 128;
    a = clock();
    for (int i = 0; i < n; ++i) ASSERT_EQ(gpu.api->session_decode(gpu.session, t, &t), EH_OK);
    const double tg = std::chrono::duration<double>(clock() - a).count();
    std::printf("gpt-oss-20b MXFP4: pp512 %.0f tokens/s, decode %.1f tokens/s (%d tokens at context ~%d)\n",
                512 / pp, n / tg, n, 512 + 4);
}
