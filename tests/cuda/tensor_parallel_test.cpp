// llama-cuda's tensor parallelism (ABI 1.6: the load names a GPU per rank):
// attention and the KV cache split by KV head, the FFN by rows then
// columns, one all-reduce after attn_output and one after ffn_down. In the
// shard mode (one GPU named once per rank: the ranks one after another on
// the step's stream), in the streams mode on one GPU (the load option
// "tensor_parallel": "streams": each rank on its own stream with its own
// residual, events around every all-reduce, the code path of distinct
// GPUs) and, where the machine has them, across distinct GPUs. The sharded
// model must compute what the whole one does: teacher-forced top-1
// agreement >= 99 % and |delta logprob| <= 0.02 at every position of
// prefill chunks (short and >= 64 tokens), batched decodes and single-token
// decodes (CUDA graphs on), and the same greedy tokens. Also the all-reduce
// kernel against a host sum, the rank group's all-reduce (eager and
// captured in a graph) and its cost per call, and every refusal by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <ehcuda/allreduce.hpp>
#include <ehcuda/graph.hpp>
#include <ehcuda/tp_group.hpp>

#include "gpu_util.hpp"
#include "plugin_handle.hpp"
#include "step_seq.hpp"
#include "tiny_model.hpp"
#include "tp_agreement.hpp"

namespace {

using namespace ehtest;

// tp_agreement.hpp's load of a forged tiny model.
struct Loaded : TpLoaded {
    // device: eh_load_params.device; -1: devices[0] (or 0), as the host sets it
    Loaded(const TinyModel& tm, const std::vector<int32_t>& devices, const char* options = nullptr, int device = -1)
        : TpLoaded(llama_cuda_api(), "tiny-tp", tm.view(), devices, options, device) {}
};

// Teacher-forced logits at every position of tp_agreement.hpp's schedule.
std::vector<std::vector<float>> teacher_forced(const TinyModel& tm, const std::vector<int32_t>& devices,
                                               const char* options = nullptr) {
    Loaded m(tm, devices, options);
    EXPECT_EQ(m.status, EH_OK) << m.error;
    if (m.status != EH_OK) return {};
    return tp_teacher_forced(*m.sm, tm.spec().n_vocab);
}

constexpr const char* kStreams = R"({"tensor_parallel":"streams"})";

struct TpCase {
    std::string name;
    TinySpec spec;
    int tp;
    const char* options = nullptr;
};

TinySpec spec_of(const std::string& arch, uint32_t wtype, int n_embd, int n_head, int n_kv, int n_ff) {
    TinySpec s;
    s.arch = arch;
    s.wtype = wtype;
    s.n_embd = n_embd;
    s.n_head = n_head;
    s.n_kv = n_kv;
    s.n_ff = n_ff;
    if (arch == "phi3") s.window = 48;
    return s;
}

class TensorParallel : public ::testing::TestWithParam<TpCase> {};

// The model over `devices` against the whole one at every position.
void expect_agreement(const TinyModel& tm, const std::vector<int32_t>& devices, const char* options,
                      const std::string& name) {
    std::string set;
    for (int32_t d : devices) set += (set.empty() ? "" : ",") + std::to_string(d);
    const auto one = teacher_forced(tm, {}, options);
    const auto many = teacher_forced(tm, devices, options);
    expect_tp_agreement(one, many, name + " devices " + set + " " + (options ? options : ""));
}

#define REQUIRE_LLAMA_CUDA()                                                 \
    REQUIRE_GPU();                                                           \
    ASSERT_NE(llama_cuda_api(), nullptr) << "llama-cuda plugin not loadable"

// The sharded model's logits against the whole model's at every position.
TEST_P(TensorParallel, TeacherForcedLogitsAgreeWithOneRank) {
    REQUIRE_LLAMA_CUDA();
    const TpCase& tc = GetParam();
    TinyModel tm(tc.spec);
    expect_agreement(tm, std::vector<int32_t>(size_t(tc.tp), 0), tc.options, tc.name);
}

// Greedy continuations of three prompts decoded together: the same tokens.
TEST_P(TensorParallel, GreedyTokensAreTheSameAsOneRank) {
    REQUIRE_LLAMA_CUDA();
    const TpCase& tc = GetParam();
    TinyModel tm(tc.spec);
    auto run = [&](const std::vector<int32_t>& devices) {
        Loaded m(tm, devices, tc.options);
        EXPECT_EQ(m.status, EH_OK) << m.error;
        std::vector<std::vector<int32_t>> out(3);
        if (m.status != EH_OK) return out;
        std::vector<std::vector<int32_t>> prompts;
        std::vector<eh_seq*> s;
        std::vector<eh_step_entry> es;
        for (int i = 0; i < 3; ++i) {
            prompts.push_back(tp_tokens(size_t(9 + 13 * i), uint32_t(7 + i), tc.spec.n_vocab));
            s.push_back(m.sm->create());
        }
        for (int i = 0; i < 3; ++i)
            es.push_back(step_entry(s[size_t(i)], prompts[size_t(i)].data(), uint32_t(prompts[size_t(i)].size()),
                                    EH_STEP_SAMPLE));
        std::vector<int32_t> next(3);
        for (int g = 0; g < 20; ++g) {
            EXPECT_EQ(m.sm->api->step(m.model, es.data(), 3), EH_OK) << m.sm->error();
            for (size_t j = 0; j < 3; ++j) {
                out[j].push_back(es[j].token);
                next[j] = es[j].token;
                es[j] = step_entry(s[j], &next[j], 1, EH_STEP_SAMPLE);
            }
        }
        return out;
    };
    const auto one = run({});
    const auto many = run(std::vector<int32_t>(size_t(tc.tp), 0));
    for (size_t j = 0; j < 3; ++j) EXPECT_EQ(one[j], many[j]) << "sequence " << j;
}

INSTANTIATE_TEST_SUITE_P(
    Shards, TensorParallel,
    ::testing::Values(
        // F16 weights, 4 KV heads: two and four ranks (one KV head each)
        TpCase{"llama_f16", spec_of("llama", EH_TYPE_F16, 512, 8, 4, 512), 2},
        TpCase{"llama_f16", spec_of("llama", EH_TYPE_F16, 512, 8, 4, 512), 4},
        // head dim 32: the generic attention kernels
        TpCase{"llama_f32_hd32", spec_of("llama", EH_TYPE_F32, 256, 8, 4, 512), 2},
        // Q4_K: attn_output and ffn_down cut on whole 256-element blocks
        TpCase{"llama_q4k", spec_of("llama", EH_TYPE_Q4_K, 512, 8, 4, 1024), 2},
        // the same without the FP16 mirror (multi-token steps on slabs)
        TpCase{"llama_q4k_slabs", spec_of("llama", EH_TYPE_Q4_K, 512, 8, 4, 1024), 2, R"({"fp16_weights":"off"})"},
        // qwen2: Q, K, V biases sliced with their rows
        TpCase{"qwen2_q8_0", spec_of("qwen2", EH_TYPE_Q8_0, 512, 8, 2, 512), 2},
        // phi3: fused qkv and gate|up tensors, a sliding window; Q4_0
        TpCase{"phi3_q4_0", spec_of("phi3", EH_TYPE_Q4_0, 512, 8, 4, 512), 4},
        // qwen3: the per-head q/k RMSNorm (one weight every head shares) on each rank's heads
        TpCase{"qwen3_q4k", spec_of("qwen3", EH_TYPE_Q4_K, 512, 8, 4, 1024), 2},
        // an FFN of 3 x 32 rows: the ranks get 64 and 32
        TpCase{"llama_uneven_ffn", spec_of("llama", EH_TYPE_F16, 256, 4, 2, 96), 2},
        // The streams mode on one GPU: every rank on its own stream, its own
        // residual, the event barriers around each all-reduce (the path of
        // distinct GPUs), CUDA graphs over all the streams
        TpCase{"streams_llama_f16", spec_of("llama", EH_TYPE_F16, 512, 8, 4, 512), 2, kStreams},
        TpCase{"streams_llama_f16", spec_of("llama", EH_TYPE_F16, 512, 8, 4, 512), 4, kStreams},
        TpCase{"streams_llama_q4k", spec_of("llama", EH_TYPE_Q4_K, 512, 8, 4, 1024), 2, kStreams},
        TpCase{"streams_llama_q4k_slabs", spec_of("llama", EH_TYPE_Q4_K, 512, 8, 4, 1024), 2,
               R"({"fp16_weights":"off","tensor_parallel":"streams"})"},
        TpCase{"streams_qwen2_q8_0", spec_of("qwen2", EH_TYPE_Q8_0, 512, 8, 2, 512), 2, kStreams},
        TpCase{"streams_phi3_q4_0", spec_of("phi3", EH_TYPE_Q4_0, 512, 8, 4, 512), 4, kStreams},
        TpCase{"streams_llama_f32_hd32", spec_of("llama", EH_TYPE_F32, 256, 8, 4, 512), 2, kStreams}),
    [](const auto& info) { return info.param.name + "_tp" + std::to_string(info.param.tp); });

// What cannot be sharded is refused at load, by name; nothing is left.
TEST(TensorParallelLoad, RefusalsNameWhy) {
    REQUIRE_LLAMA_CUDA();
    auto refusal = [](const TinySpec& s, const std::vector<int32_t>& d, eh_status want, int device = -1) {
        TinyModel tm(s);
        Loaded m(tm, d, nullptr, device);
        EXPECT_EQ(m.status, want) << m.error;
        EXPECT_EQ(m.model, nullptr);
        return m.error;
    };
    const TinySpec f16 = spec_of("llama", EH_TYPE_F16, 256, 8, 2, 512);
    EXPECT_NE(refusal(f16, {0, 0, 0, 0}, EH_UNSUPPORTED).find("2 KV heads do not split over 4 ranks"), std::string::npos);
    int count = 0;
    ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
    // a GPU the machine does not have; "serial" across distinct GPUs; a mode
    // that does not exist
    EXPECT_NE(refusal(f16, {0, count}, EH_INVALID_ARGUMENT).find("names GPU " + std::to_string(count) + "; " +
                                                                  std::to_string(count) + " present"),
              std::string::npos);
    {
        TinyModel tm(f16);
        Loaded m(tm, {0, count}, R"({"tensor_parallel":"serial"})");
        EXPECT_EQ(m.status, EH_INVALID_ARGUMENT);
        EXPECT_NE(m.error.find("\"tensor_parallel\": \"serial\" runs every rank on one GPU"), std::string::npos)
            << m.error;
        Loaded bad(tm, {0, 0}, R"({"tensor_parallel":"rings"})");
        EXPECT_EQ(bad.status, EH_INVALID_ARGUMENT);
        EXPECT_NE(bad.error.find("tensor_parallel"), std::string::npos) << bad.error;
    }
    EXPECT_NE(refusal(f16, std::vector<int32_t>(9, 0), EH_INVALID_ARGUMENT).find("at most 8 devices"), std::string::npos);
    EXPECT_NE(refusal(f16, {1, 0}, EH_INVALID_ARGUMENT, 0).find("devices[0] (1) is not eh_load_params.device (0)"),
              std::string::npos);
    // Q4_K attn_output of 256 columns: two ranks would cut a 256-block in half
    EXPECT_NE(refusal(spec_of("llama", EH_TYPE_Q4_K, 256, 8, 4, 512), {0, 0}, EH_UNSUPPORTED)
                  .find("attn_output.weight' (Q4_K) cannot be cut at columns 0..128"),
              std::string::npos);
}

// The all-reduce kernel: the rank-order sum, bit for bit as the host adds
// it, into every output, added to it or not; float4 and scalar paths (a
// length not a multiple of 4, a misaligned pointer).
TEST(AllReduce, OneShotSumsInRankOrderIntoEveryOutput) {
    REQUIRE_GPU();
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    for (int nranks : {1, 2, 3, 8})
        for (size_t n : {size_t(1), size_t(4093), size_t(65536)})
            for (int misalign : {0, 1})
                for (bool acc : {false, true}) {
                    SCOPED_TRACE(std::to_string(nranks) + " ranks, n " + std::to_string(n) + ", misalign " +
                                 std::to_string(misalign) + ", accumulate " + std::to_string(acc));
                    std::vector<std::vector<float>> in(size_t(nranks), std::vector<float>(n + 1));
                    std::vector<float> base(n + 1);
                    for (auto& v : in)
                        for (float& x : v) x = u(rng);
                    for (float& x : base) x = u(rng);
                    std::vector<ehcuda::DeviceBuffer> din, dout;
                    ehcuda::AllReduceArgs a;
                    for (int r = 0; r < nranks; ++r) {
                        din.push_back(to_device(in[size_t(r)]));
                        a.in[r] = din.back().as<float>() + misalign;
                    }
                    for (int o = 0; o < 2; ++o) {
                        dout.push_back(to_device(base));
                        a.out[o] = dout.back().as<float>();
                    }
                    a.nranks = nranks;
                    a.nout = 2;
                    a.n = n;
                    a.accumulate = acc;
                    ehcuda::allreduce_oneshot(a, nullptr);
                    for (int o = 0; o < 2; ++o) {
                        const auto got = to_host<float>(dout[size_t(o)], n);
                        size_t bad = 0;
                        for (size_t i = 0; i < n; ++i) {
                            float s = in[0][i + size_t(misalign)];
                            for (int r = 1; r < nranks; ++r) s += in[size_t(r)][i + size_t(misalign)];
                            const float want = acc ? base[i] + s : s;
                            if (got[i] != want) ++bad;
                        }
                        EXPECT_EQ(bad, 0u) << "output " << o;
                    }
                }
    // What one call costs on this GPU (a decode step's residual of one token,
    // n_embd 4096 and 8192; and 64 tokens' of 4096), printed for the notes.
    for (int nranks : {2, 4})
        for (size_t n : {size_t(4096), size_t(8192), size_t(64 * 4096)}) {
            std::vector<ehcuda::DeviceBuffer> bufs;
            ehcuda::AllReduceArgs a;
            for (int r = 0; r <= nranks; ++r) bufs.emplace_back(n * 4);
            for (int r = 0; r < nranks; ++r) a.in[r] = bufs[size_t(r)].as<float>();
            a.out[0] = bufs[size_t(nranks)].as<float>();
            a.nranks = nranks;
            a.nout = 1;
            a.n = n;
            a.accumulate = true;
            cudaEvent_t e0, e1;
            GPU_OK(cudaEventCreate(&e0));
            GPU_OK(cudaEventCreate(&e1));
            for (int i = 0; i < 20; ++i) ehcuda::allreduce_oneshot(a, nullptr);
            GPU_OK(cudaEventRecord(e0, nullptr));
            constexpr int kCalls = 200;
            for (int i = 0; i < kCalls; ++i) ehcuda::allreduce_oneshot(a, nullptr);
            GPU_OK(cudaEventRecord(e1, nullptr));
            GPU_OK(cudaEventSynchronize(e1));
            float ms = 0;
            GPU_OK(cudaEventElapsedTime(&ms, e0, e1));
            std::printf("[tp] all-reduce one-shot, one GPU: %d ranks x %zu floats: %.2f us a call (back to back)\n", nranks,
                        n, 1000.0 * ms / kCalls);
            cudaEventDestroy(e0);
            cudaEventDestroy(e1);
        }
    ehcuda::AllReduceArgs bad;
    bad.nranks = 9;
    bad.nout = 1;
    EXPECT_THROW(ehcuda::allreduce_oneshot(bad, nullptr), ehp::Error);
}

// The load's log says how the ranks run: one after another (the shard
// mode, the default on one GPU) or each on its own stream, and each rank's GPU.
TEST(TensorParallelLoad, LogSaysHowTheRanksRun) {
    REQUIRE_LLAMA_CUDA();
    TinyModel tm(spec_of("llama", EH_TYPE_F16, 512, 8, 4, 512));
    auto line = [](const Loaded& m) {
        for (const std::string& s : m.stages)
            if (s.find("tensor parallel: ") != std::string::npos) return s;
        return std::string();
    };
    Loaded serial(tm, {0, 0});
    ASSERT_EQ(serial.status, EH_OK) << serial.error;
    EXPECT_NE(line(serial).find("2 ranks, one after another on the step's stream (shard mode)"), std::string::npos)
        << line(serial);
    Loaded streams(tm, {0, 0}, kStreams);
    ASSERT_EQ(streams.status, EH_OK) << streams.error;
    EXPECT_NE(line(streams).find("2 ranks, each on its own stream"), std::string::npos) << line(streams);
    EXPECT_NE(line(streams).find("[GPU 0, query heads 4+4, KV heads 2+2"), std::string::npos) << line(streams);
}

// Distinct GPUs, where the machine has them: 2 and 4 ranks.
TEST(TensorParallelGpus, DistinctGpusAgreeWithOneRank) {
    REQUIRE_LLAMA_CUDA();
    int count = 0;
    ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
    if (count < 2) GTEST_SKIP() << "one GPU: the streams mode on it stands in (TensorParallel.*streams*)";
    TinyModel q4k(spec_of("llama", EH_TYPE_Q4_K, 512, 8, 4, 1024));
    expect_agreement(q4k, {0, 1}, nullptr, "gpus_llama_q4k");
    TinyModel phi(spec_of("phi3", EH_TYPE_Q4_0, 512, 8, 4, 512));
    if (count >= 4) expect_agreement(phi, {0, 1, 2, 3}, nullptr, "gpus_phi3_q4_0");
    // every message through NCCL where it loads (0: NCCL from 0 floats on)
    expect_agreement(q4k, {0, 1}, R"({"kernels":{"allreduce_nccl_min_floats":0}})", "gpus_llama_q4k_nccl");
    // the one-shot all-reduce behind its in-kernel signal barrier
    expect_agreement(q4k, {0, 1}, R"({"kernels":{"allreduce_signals":true}})", "gpus_llama_q4k_signals");
    if (count >= 4)
        expect_agreement(phi, {0, 1, 2, 3}, R"({"kernels":{"allreduce_signals":true}})", "gpus_phi3_q4_0_signals");
}

// The rank group's all-reduce paths.
constexpr int kEvents = 0, kSignals = 1, kNccl = 2;
const char* const kModeName[] = {"one-shot (event barrier)", "one-shot (signal barrier)", "NCCL"};

// The device sets the rank group's tests run on: two ranks on GPU 0 (the
// streams mode), then 0,1 and 0,1,2,3 where the machine has them.
std::vector<std::vector<int>> group_sets() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    std::vector<std::vector<int>> sets = {{0, 0}};
    if (count >= 2) sets.push_back({0, 1});
    if (count >= 4) sets.push_back({0, 1, 2, 3});
    return sets;
}

// The rank group's all-reduce: every rank's output gets the sum of every
// rank's partial, bit for bit the rank-order host sum (one-shot, behind
// events or its in-kernel signal barrier) or within float rounding (NCCL's
// own order), over several all-reduces in a row (the alternating partial
// buffers), run eagerly and as one captured graph. (Ranks sharing a GPU
// take the signal barrier eagerly only, on two fresh streams: their kernels
// must run at once, which a graph's branches on one GPU do not promise;
// llama-cuda never gives it a shared GPU.)
TEST(TpGroup, AllReduceAddsEveryPartialIntoEveryRank) {
    REQUIRE_GPU();
    constexpr size_t n = 8192 * 3 + 5;
    constexpr int kRounds = 5;
    for (const std::vector<int>& devs : group_sets())
        for (int mode : {kEvents, kSignals, kNccl})
            for (bool graphed : {false, true}) {
                const bool nccl = mode == kNccl;
                const int N = int(devs.size());
                ehcuda::TpGroup g(devs, devs[0], n, nccl, nullptr);
                if (nccl && !g.nccl()) {
                    std::printf("[tp] devices %d..: no NCCL (%s)\n", devs.back(), g.nccl_why().c_str());
                    continue;
                }
                if (mode == kSignals && graphed && !g.distinct_gpus()) continue;
                SCOPED_TRACE(std::to_string(N) + " ranks on " + std::to_string(devs.back() + 1) + " GPUs, " +
                             kModeName[mode] + ", graphed " + std::to_string(graphed));
                std::mt19937 rng(11);
                std::uniform_real_distribution<float> u(-2.0f, 2.0f);
                // round k's partial of rank r
                std::vector<std::vector<std::vector<float>>> part(kRounds, std::vector<std::vector<float>>(size_t(N)));
                std::vector<std::vector<ehcuda::DeviceBuffer>> dpart(kRounds);
                std::vector<float> base(n);
                for (float& x : base) x = u(rng);
                std::vector<ehcuda::DeviceBuffer> out;
                float* outs[ehcuda::kMaxRanks] = {};
                for (int r = 0; r < N; ++r) {
                    GPU_OK(cudaSetDevice(devs[size_t(r)]));
                    out.push_back(to_device(base));
                    outs[r] = out.back().as<float>();
                    for (int k = 0; k < kRounds; ++k) {
                        part[size_t(k)][size_t(r)].resize(n);
                        for (float& x : part[size_t(k)][size_t(r)]) x = u(rng);
                        dpart[size_t(k)].push_back(to_device(part[size_t(k)][size_t(r)]));
                    }
                }
                GPU_OK(cudaSetDevice(devs[0]));
                ehcuda::Stream main;
                const size_t nccl_min = nccl ? 0 : SIZE_MAX;
                auto body = [&] {
                    g.fork(main.get());
                    for (int k = 0; k < kRounds; ++k) {
                        for (int r = 0; r < N; ++r) {
                            g.use(r);
                            ASSERT_EQ(cudaMemcpyAsync(g.partial(r), dpart[size_t(k)][size_t(r)].get(), n * 4,
                                                      cudaMemcpyDefault, g.stream(r)),
                                      cudaSuccess);
                        }
                        g.all_reduce_add(outs, n, nccl_min, mode == kSignals);
                    }
                    g.join(main.get());
                };
                ehcuda::CapturedGraph graph;
                if (graphed) {
                    graph.capture(main.get(), body);
                    graph.launch(main.get());
                } else {
                    body();
                }
                GPU_OK(cudaStreamSynchronize(main.get()));
                for (int r = 0; r < N; ++r) {
                    GPU_OK(cudaSetDevice(devs[size_t(r)]));
                    const auto got = to_host<float>(out[size_t(r)], n);
                    size_t bad = 0;
                    double worst = 0;
                    for (size_t i = 0; i < n; ++i) {
                        float want = base[i];
                        for (int k = 0; k < kRounds; ++k) {
                            float sum = part[size_t(k)][0][i];
                            for (int q = 1; q < N; ++q) sum += part[size_t(k)][size_t(q)][i];
                            want += sum;
                        }
                        const double d = std::fabs(double(got[i]) - double(want));
                        worst = std::max(worst, d);
                        if (nccl ? d > 1e-4 : got[i] != want) ++bad;
                    }
                    EXPECT_EQ(bad, 0u) << "rank " << r << ": worst difference " << worst;
                }
                GPU_OK(cudaSetDevice(devs[0]));
            }
    EXPECT_THROW(ehcuda::TpGroup(std::vector<int>(9, 0), 0, 16, false, nullptr), ehp::Error);
}

// What one all-reduce costs per call (the residual of a decode step: n_embd
// 8192 x 1 .. 64 tokens), one-shot and NCCL, back to back on the ranks'
// streams with their event barriers: issued eagerly (a prefill step's
// case) and replayed from one captured graph of 50 calls (a decode step's:
// its graph holds the barriers as edges); printed for the notes. Two ranks
// on one GPU measure the barrier and launch cost (their reads stay local).
TEST(TpGroup, AllReduceMicrosecondsPerCall) {
    REQUIRE_GPU();
    constexpr size_t kHidden = 8192;
    for (const std::vector<int>& devs : group_sets())
        for (int mode : {kEvents, kSignals, kNccl}) {
            const bool nccl = mode == kNccl, signals = mode == kSignals;
            ehcuda::TpGroup g(devs, devs[0], kHidden * 64, nccl, nullptr);
            std::string set;
            for (int d : devs) set += (set.empty() ? "" : ",") + std::to_string(d);
            if (nccl && !g.nccl()) {
                std::printf("[tp] all-reduce NCCL, devices %s: not run (%s)\n", set.c_str(), g.nccl_why().c_str());
                continue;
            }
            std::vector<ehcuda::DeviceBuffer> out;
            float* outs[ehcuda::kMaxRanks] = {};
            for (int r = 0; r < g.size(); ++r) {
                g.use(r);
                out.emplace_back(kHidden * 64 * 4);
                GPU_OK(cudaMemset(out.back().get(), 0, kHidden * 64 * 4));
                outs[r] = out.back().as<float>();
            }
            GPU_OK(cudaSetDevice(devs[0]));
            ehcuda::Stream main;
            cudaEvent_t e0, e1;
            GPU_OK(cudaEventCreate(&e0));
            GPU_OK(cudaEventCreate(&e1));
            for (int tokens : {1, 2, 4, 8, 16, 32, 64}) {
                const size_t n = kHidden * size_t(tokens);
                const size_t nccl_min = nccl ? 0 : SIZE_MAX;
                g.fork(main.get());
                for (int i = 0; i < 20; ++i) g.all_reduce_add(outs, n, nccl_min, signals);
                g.join(main.get());
                GPU_OK(cudaEventRecord(e0, main.get()));
                g.fork(main.get());
                constexpr int kCalls = 200;
                for (int i = 0; i < kCalls; ++i) g.all_reduce_add(outs, n, nccl_min, signals);
                g.join(main.get());
                GPU_OK(cudaEventRecord(e1, main.get()));
                GPU_OK(cudaEventSynchronize(e1));
                float ms = 0;
                GPU_OK(cudaEventElapsedTime(&ms, e0, e1));
                const double eager_us = 1000.0 * ms / kCalls;
                if (signals && !g.distinct_gpus()) {  // (eagerly only on a shared GPU: see above)
                    std::printf("[tp] all-reduce %s, devices %s: %d tokens x %zu floats: %.2f us a call eager\n",
                                kModeName[mode], set.c_str(), tokens, kHidden, eager_us);
                    continue;
                }
                constexpr int kInGraph = 50, kReplays = 20;
                ehcuda::CapturedGraph graph;
                graph.capture(main.get(), [&] {
                    g.fork(main.get());
                    for (int i = 0; i < kInGraph; ++i) g.all_reduce_add(outs, n, nccl_min, signals);
                    g.join(main.get());
                });
                graph.launch(main.get());
                GPU_OK(cudaEventRecord(e0, main.get()));
                for (int i = 0; i < kReplays; ++i) graph.launch(main.get());
                GPU_OK(cudaEventRecord(e1, main.get()));
                GPU_OK(cudaEventSynchronize(e1));
                GPU_OK(cudaEventElapsedTime(&ms, e0, e1));
                std::printf("[tp] all-reduce %s, devices %s: %d tokens x %zu floats: %.2f us a call eager, %.2f in a "
                            "graph\n",
                            kModeName[mode], set.c_str(), tokens, kHidden, eager_us,
                            1000.0 * ms / (kInGraph * kReplays));
            }
            cudaEventDestroy(e0);
            cudaEventDestroy(e1);
        }
}

}  // namespace
