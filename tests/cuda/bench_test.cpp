// First performance numbers (not assertions): decode and prefill tokens/s on
// synthetic real-shape models, and GEMV weight-streaming bandwidth against
// the device's copy bandwidth. Disabled by default; run with
//   eh_cuda_tests --gtest_also_run_disabled_tests --gtest_filter='*Bench*'
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>


#include <engine_host/plugin_abi.hpp>
#include <ehcuda/kernels.hpp>

#include "gpu_util.hpp"
#include "host_reference.hpp"
#include "plugin_handle.hpp"
#include "profiled_step.hpp"
#include "step_seq.hpp"
#include "tiny_model.hpp"

namespace ehtest {
namespace {

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One sequence through the batched step (the served path): pp512 as one
// 512-token step, best of 3 after a warm-up, then tg128 after an
// EH_BENCH_DEPTH-token prompt (default 16), the first decode step outside
// the timing.
void bench_model(const char* label, TinySpec spec) {
    double t0 = now_s();
    TinyModel tm(spec);
    std::printf("[bench] %s: built synthetic weights in %.1f s\n", label, now_s() - t0);
    const eh_plugin_api* api = llama_cuda_api();
    ASSERT_NE(api, nullptr);
    const int depth = std::getenv("EH_BENCH_DEPTH") ? std::max(1, std::atoi(std::getenv("EH_BENCH_DEPTH"))) : 16;
    t0 = now_s();
    // EH_BENCH_OPTIONS: the load's options, e.g. {"fp16_weights":"off"}
    StepSeq s(api, tm.view(), one_seq(uint32_t(std::max(1024, depth + 256))), std::getenv("EH_BENCH_OPTIONS"), label);
    ASSERT_TRUE(s.ok()) << s.failure;
    const double load_s = now_s() - t0;  // (with kv_init's pool and warm-up)
    s.flags = EH_STEP_SAMPLE;            // as the server's steps: no logits kept
    std::vector<int32_t> prompt(size_t(std::max(512, depth)));
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 7919) % static_cast<size_t>(spec.n_vocab));
    double best_pp = 1e9;
    const int pp_reps = std::getenv("EH_BENCH_SKIP_PP") ? 0 : 4;
    for (int r = 0; r < pp_reps; ++r) {
        ASSERT_EQ(s.reset(), EH_OK) << s.error();
        t0 = now_s();
        ASSERT_EQ(s.prefill(prompt.data(), 512), EH_OK) << s.error();
        if (r) best_pp = std::min(best_pp, now_s() - t0);
    }
    ASSERT_EQ(s.reset(), EH_OK) << s.error();
    int32_t tok = 0;
    ASSERT_EQ(s.prefill(prompt.data(), uint32_t(depth), &tok), EH_OK) << s.error();
    ASSERT_EQ(s.decode(tok, &tok), EH_OK) << s.error();
    const ProfiledStep prof;
    t0 = now_s();
    for (int i = 0; i < 128; ++i) {
        prof.begin(i);
        ASSERT_EQ(s.decode(tok, &tok), EH_OK) << s.error();
        prof.end(i);
    }
    const double tg = now_s() - t0;
    eh_model_info mi{};
    mi.struct_size = sizeof mi;
    ASSERT_EQ(api->model_get_info(s.model, &mi), EH_OK);
    std::printf("[bench] %s (%s): load + kv_init %.2f s, device bytes %.1f MiB\n", label, mi.device_name, load_s,
                double(mi.device_bytes_used) / (1 << 20));
    std::printf("[bench] %s: pp512 %.0f tok/s, tg128 after %d tokens %.0f tok/s (%.3f ms/token)\n", label, 512 / best_pp,
                depth, 128 / tg, tg / 128 * 1e3);
}

TinySpec qwen_spec() {
    TinySpec q;
    q.arch = "qwen2";
    q.n_embd = 896;
    q.n_layer = 24;
    q.n_head = 14;
    q.n_kv = 2;
    q.n_ff = 4864;
    q.n_vocab = 151936;
    q.freq_base = 1000000.0f;
    q.eps = 1e-6f;
    q.tied = true;
    // 896-wide rows are not whole 256-blocks, so (as llama.cpp's Q4_K_M does)
    // those matrices fall back to a 32-block type; ffn_down is K-quant.
    q.wtype = EH_TYPE_Q5_0;
    q.embd_type = EH_TYPE_Q8_0;
    for (int i = 0; i < q.n_layer; ++i)
        q.overrides["blk." + std::to_string(i) + ".ffn_down.weight"] = (i % 3 == 0) ? EH_TYPE_Q6_K : EH_TYPE_Q4_K;
    return q;
}

TinySpec phi3_spec() {
    TinySpec p;
    p.arch = "phi3";
    p.n_embd = 3072;
    p.n_layer = 32;
    p.n_head = 32;
    p.n_kv = 32;
    p.n_ff = 8192;
    p.n_vocab = 32064;
    p.wtype = EH_TYPE_Q4_K;
    p.embd_type = EH_TYPE_Q4_K;
    p.out_type = EH_TYPE_Q6_K;
    for (int i = 0; i < p.n_layer; ++i) {
        std::string b = "blk." + std::to_string(i) + ".";
        if (i % 3 == 0) p.overrides[b + "ffn_down.weight"] = EH_TYPE_Q6_K;
        p.overrides[b + "attn_qkv.weight"] = EH_TYPE_Q5_K;
    }
    return p;
}

// The same sequence as `engine-host bench -p 512 -n 128 -r 5` (its step
// path, one sequence): sequences of p + n + 1 tokens, greedy sampling; per
// repetition an empty sequence, the prompt in one step (which samples),
// then n decode steps, each timed on the host. Repetition 0 is the warm-up.
void host_bench(const char* label, TinySpec spec) {
    TinyModel tm(spec);
    const eh_plugin_api* api = llama_cuda_api();
    ASSERT_NE(api, nullptr);
    const uint32_t np = 512, ng = 128, reps = 5;
    // EH_BENCH_OPTIONS: the load's options, e.g. {"fp16_weights":"off"}
    StepSeq s(api, tm.view(), one_seq(np + ng + 1), std::getenv("EH_BENCH_OPTIONS"), label);
    ASSERT_TRUE(s.ok()) << s.failure;
    s.flags = EH_STEP_SAMPLE;
    eh_sampling_params p = ehp::greedy_sampling();
    p.seed = 1234;
    ASSERT_EQ(s.set_sampling(p), EH_OK) << s.error();
    std::vector<int32_t> prompt(np);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 7919 + 13) % static_cast<size_t>(spec.n_vocab));
    std::vector<double> pp, tg, itl;
    for (uint32_t rep = 0; rep <= reps; ++rep) {
        ASSERT_EQ(s.reset(), EH_OK) << s.error();
        double t0 = now_s();
        int32_t tok = 0;
        ASSERT_EQ(s.prefill(prompt.data(), np, &tok), EH_OK) << s.error();
        const double t_pp = now_s() - t0;
        std::vector<double> steps;
        const double td = now_s();
        for (uint32_t i = 0; i < ng; ++i) {
            const double ts = now_s();
            ASSERT_EQ(s.decode(tok, &tok), EH_OK) << s.error();
            steps.push_back(now_s() - ts);
        }
        const double t_tg = now_s() - td;
        if (rep == 0) continue;
        pp.push_back(np / t_pp);
        tg.push_back(ng / t_tg);
        itl.insert(itl.end(), steps.begin(), steps.end());
    }
    auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
    };
    std::printf("[hostbench] %s: pp%u %.0f tok/s, tg%u %.0f tok/s, ITL p50 %.3f ms (sequence of %u tokens)\n", label, np,
                median(pp), ng, median(tg), 1e3 * median(itl), s.kv.max_seq_tokens);
    std::fflush(stdout);
}

TEST(Bench, DISABLED_Qwen25_05B_Q4KM_Shape) {
    REQUIRE_GPU();
    bench_model("qwen2.5-0.5b-q4_k_m-shape", qwen_spec());
}

TEST(Bench, DISABLED_Phi3Mini_Q4KM_Shape) {
    REQUIRE_GPU();
    bench_model("phi-3-mini-q4_k_m-shape", phi3_spec());
}

TEST(Bench, DISABLED_HostSequence_Qwen25_05B) {
    REQUIRE_GPU();
    host_bench("qwen2.5-0.5b-q4_k_m-shape", qwen_spec());
}

TEST(Bench, DISABLED_HostSequence_Phi3Mini) {
    REQUIRE_GPU();
    host_bench("phi-3-mini-q4_k_m-shape", phi3_spec());
}

// The batched step's own cost, without the host: `batch` sequences with a
// 128-token prompt each, then 64 decode steps of all of them, timed per step
// on the host clock (the step returns after its tokens are read back).
void batched_bench(const char* label, TinySpec spec) {
    TinyModel tm(spec);
    const eh_plugin_api* api = llama_cuda_api();
    ASSERT_NE(api, nullptr);
    ASSERT_NE(api->step, nullptr);
    eh_load_params lp{};
    lp.struct_size = sizeof lp;
    lp.path = label;
    lp.options_json = std::getenv("EH_BENCH_OPTIONS");  // e.g. {"fp16_weights":"off"}
    lp.view = tm.view();
    eh_model* m = nullptr;
    ASSERT_EQ(api->model_load(&lp, &m), EH_OK) << api->plugin_last_error();
    eh_kv_params kp{};
    kp.struct_size = sizeof kp;
    kp.max_seqs = 64;
    kp.max_step_tokens = 8192;
    kp.max_step_entries = 64;
    kp.max_seq_tokens = 256;
    kp.budget_bytes = 8ull << 30;
    eh_kv_info ki{};
    ki.struct_size = sizeof ki;
    ASSERT_EQ(api->kv_init(m, &kp, &ki), EH_OK) << api->model_last_error(m);
    std::vector<int> batches = {1, 2, 4, 8, 16, 32, 64};
    if (const char* e = std::getenv("EH_BENCH_BATCHES")) {  // e.g. "1,4"
        batches.clear();
        for (const char* p = e; *p;) {
            batches.push_back(std::atoi(p));
            while (*p && *p != ',') ++p;
            if (*p == ',') ++p;
        }
    }
    for (int batch : batches) {
        std::vector<eh_seq*> seqs(static_cast<size_t>(batch), nullptr);
        std::vector<eh_step_entry> es(static_cast<size_t>(batch));
        std::vector<int32_t> prompt(128), next(static_cast<size_t>(batch));
        for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 7919) % size_t(spec.n_vocab));
        eh_sampling_params p{};
        p.struct_size = sizeof p;
        p.top_p = 1;
        p.repetition_penalty = 1;
        p.repetition_window = -1;
        for (int i = 0; i < batch; ++i) {
            ASSERT_EQ(api->seq_create(m, &seqs[size_t(i)]), EH_OK) << api->model_last_error(m);
            api->seq_set_sampling(seqs[size_t(i)], &p);
            es[size_t(i)] = eh_step_entry{};
            es[size_t(i)].struct_size = sizeof(eh_step_entry);
            es[size_t(i)].flags = EH_STEP_SAMPLE;
            es[size_t(i)].seq = seqs[size_t(i)];
            es[size_t(i)].tokens = prompt.data();
            es[size_t(i)].n_tokens = 128;
        }
        double t0 = now_s();
        ASSERT_EQ(api->step(m, es.data(), uint32_t(batch)), EH_OK) << api->model_last_error(m);
        const double prefill_s = now_s() - t0;
        double decode_s = 0;
        const int steps = 64;
        const ProfiledStep prof;
        for (int k = 0; k < steps + 2; ++k) {
            for (int i = 0; i < batch; ++i) {
                next[size_t(i)] = es[size_t(i)].token;
                es[size_t(i)].tokens = &next[size_t(i)];
                es[size_t(i)].n_tokens = 1;
            }
            t0 = now_s();
            prof.begin(k);
            ASSERT_EQ(api->step(m, es.data(), uint32_t(batch)), EH_OK) << api->model_last_error(m);
            prof.end(k);
            if (k >= 2) decode_s += now_s() - t0;  // the first two: warm-up and graph capture
        }
        std::printf("[bench] %s batched: batch %2d: prefill %d x 128 tokens %.2f ms; decode %.3f ms/step = %.0f tok/s\n",
                    label, batch, batch, prefill_s * 1e3, decode_s / steps * 1e3, batch * steps / decode_s);
        for (eh_seq* q : seqs) api->seq_release(q);
    }
    api->model_release(m);
}

TEST(Bench, DISABLED_Batched_Qwen25_05B) { batched_bench("qwen2.5-0.5b", qwen_spec()); }
TEST(Bench, DISABLED_Batched_Phi3Mini) { batched_bench("phi-3-mini", phi3_spec()); }

TEST(Bench, DISABLED_GemvBandwidth) {
    REQUIRE_GPU();
    // Device copy bandwidth (bytes read + written).
    const size_t N = static_cast<size_t>(1) << 30;
    ehcuda::DeviceBuffer a(N), b(N);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaMemcpy(b.get(), a.get(), N, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e0);
    for (int i = 0; i < 10; ++i) cudaMemcpyAsync(b.get(), a.get(), N, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    const double copy_bw = 2.0 * N * 10 / (ms / 1e3) / 1e9;
    std::printf("[bench] device-to-device copy: %.0f GB/s (read+write)\n", copy_bw);
    struct Shape {
        uint32_t type;
        int rows, cols;
    };
    // Large products, then decode shapes of Phi-3-mini (gate|up, down) and
    // Qwen2.5-0.5B (down, gate|up, tied Q8_0 head).
    const Shape shapes[] = {{EH_TYPE_Q4_K, 16384, 8192}, {EH_TYPE_Q6_K, 16384, 8192}, {EH_TYPE_Q5_0, 16384, 8192},
                            {EH_TYPE_Q8_0, 16384, 8192}, {EH_TYPE_Q4_0, 16384, 8192}, {EH_TYPE_F16, 16384, 8192},
                            {EH_TYPE_Q4_K, 16384, 3072}, {EH_TYPE_Q6_K, 3072, 8192},  {EH_TYPE_Q6_K, 896, 4864},
                            {EH_TYPE_Q5_0, 9728, 896},   {EH_TYPE_Q8_0, 151936, 896},
                            // llama.cpp's low-bit types: the large product, then a Llama-3-8B
                            // ffn_gate/up (14336 x 4096) and ffn_down (4096 x 14336)
                            {EH_TYPE_Q2_K, 16384, 8192}, {EH_TYPE_Q3_K, 16384, 8192}, {EH_TYPE_IQ4_NL, 16384, 8192},
                            {EH_TYPE_IQ4_XS, 16384, 8192}, {EH_TYPE_Q2_K, 14336, 4096}, {EH_TYPE_Q3_K, 14336, 4096},
                            {EH_TYPE_IQ4_NL, 14336, 4096}, {EH_TYPE_IQ4_XS, 14336, 4096}, {EH_TYPE_Q3_K, 4096, 14336},
                            {EH_TYPE_IQ4_XS, 4096, 14336},
                            // Gemma 3 12B's ffn_down (rows too long for two in a tile)
                            {EH_TYPE_Q6_K, 3840, 15360}, {EH_TYPE_Q4_K, 3840, 15360}};
    // EH_BENCH_GEMV_TYPES=Q2_K,Q3_K,...: only those types' shapes.
    const char* only = std::getenv("EH_BENCH_GEMV_TYPES");
    for (const Shape& sh : shapes) {
        const uint32_t type = sh.type;
        if (only && ("," + std::string(only) + ",").find("," + ehp::type_name(type) + ",") == std::string::npos) continue;
        const int rows = sh.rows, cols = sh.cols;
        std::mt19937 rng(1);
        auto w = random_rows(type, rows, cols, rng);
        auto dw = to_device(w);
        std::vector<float> x(static_cast<size_t>(cols), 0.01f);
        auto dx = to_device(x);
        ehcuda::DeviceBuffer dy(static_cast<size_t>(rows) * 4);
        ehcuda::MatmulArgs m;
        m.seg[0].w = {dw.get(), type, rows, cols, row_size(type, cols)};
        m.cols = cols;
        m.x = dx.as<float>();
        m.ldx = cols;
        m.y = dy.as<float>();
        m.ldy = rows;
        const ehcuda::GemvInput was = ehcuda::gemv_input();
        struct Variant {
            const char* name;
            ehcuda::GemvInput in;
            bool bulk;  // the bulk-copy kernel or the register one
            int slices = 0, slots = 2;  // the plan's bulk_slices and bulk_slice_slots
        };
        const Variant variants[] = {
            {"float-x", ehcuda::GemvInput::Float, false},
            {"int16-x register", ehcuda::GemvInput::Int16, false},
            {"int16-x bulk", ehcuda::GemvInput::Int16, true},
            {"int8-x", ehcuda::GemvInput::Int8, false},
            {"int16x2-x register", ehcuda::GemvInput::Int16x2, false},
            {"int16x2-x bulk", ehcuda::GemvInput::Int16x2, true},
            {"int16-x slice ring", ehcuda::GemvInput::Int16, true, 2, 2},
            {"int16-x slice ring 4 slots", ehcuda::GemvInput::Int16, true, 2, 4},
        };
        const bool bulk_was = ehtest::gemv_bulk_on();
        const ehcuda::KernelPlan plan_was = ehtest::test_plan();
        for (const Variant& v : variants) {
            if (v.in != ehcuda::GemvInput::Float && type == EH_TYPE_F16) continue;
            ehtest::set_gemv_input(v.in);
            ehtest::set_gemv_bulk(v.bulk);
            ehtest::test_plan().bulk_slices = v.slices;
            ehtest::test_plan().bulk_slice_slots = v.slots;
            ehcuda::gemv(m, nullptr);
            cudaEventRecord(e0);
            for (int i = 0; i < 20; ++i) ehcuda::gemv(m, nullptr);
            cudaEventRecord(e1);
            cudaEventSynchronize(e1);
            cudaEventElapsedTime(&ms, e0, e1);
            const double bw = double(w.size()) * 20 / (ms / 1e3) / 1e9;
            std::printf("[bench] gemv %s %dx%d (%.0f MB) %s: %.1f us, %.0f GB/s = %.0f%% of copy bandwidth\n",
                        ehp::type_name(type).c_str(), rows, cols, w.size() / 1e6, v.name, ms / 20 * 1e3, bw,
                        100 * bw / copy_bw);
        }
        ehtest::test_plan() = plan_was;
        ehtest::set_gemv_input(was);
        ehtest::set_gemv_bulk(bulk_was);
        if (rows != 16384 || cols != 8192) continue;
        // Prefill GEMM throughput on the same weights (512 tokens).
        std::vector<float> X(static_cast<size_t>(512) * cols, 0.01f);
        auto dX = to_device(X);
        ehcuda::DeviceBuffer dY(static_cast<size_t>(512) * rows * 4);
        m.x = dX.as<float>();
        m.y = dY.as<float>();
        m.ntok = 512;
        ehcuda::gemm(m, nullptr);
        cudaEventRecord(e0);
        for (int i = 0; i < 5; ++i) ehcuda::gemm(m, nullptr);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms, e0, e1);
        std::printf("[bench] gemm %s 512x%dx%d: %.2f ms, %.1f TFLOP/s\n", ehp::type_name(type).c_str(), rows, cols, ms / 5,
                    2.0 * 512 * rows * cols * 5 / (ms / 1e3) / 1e12);
    }
}

}  // namespace
}  // namespace ehtest
