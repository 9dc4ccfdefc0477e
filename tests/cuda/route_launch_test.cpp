// Every matmul launch matches its route (kernel_route.hpp): the real models'
// matrices of kernel_route_shapes.inc, as a batched step of 1, 8 and 64
// tokens runs them (route_step_matmul: one call per token or one call of
// all), under the plan chosen for this GPU and five variants (exact routing,
// float input, bulk off, mixed off, token groups decoded once with the
// RMSNorm). A recorder
// (launch_record.hpp) sees each call's route and the launches it made; each
// launch must be the route's kernel with its grid, block and shared bytes,
// in order, and nothing else may launch.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.hpp>
#include <ehcuda/device_memory.hpp>
#include <ehcuda/kernels.hpp>
#include <ehcuda/launch_record.hpp>
#include <ehcuda/prefill_workspace.hpp>

#include "gpu_util.hpp"

namespace {

using ehcuda::GemvShape;
using ehcuda::KernelPlan;
using ehcuda::MatmulShape;
using ehcuda::RouteKernel;

#include "kernel_route_shapes.inc"

struct Launch {
    std::string kernel;
    unsigned blocks, threads;
    size_t smem;
};

struct Call {
    MatmulShape m;
    ehcuda::MatmulRoute route;
    std::vector<Launch> launches;
};

struct Recorder : ehcuda::LaunchRecorder {
    std::vector<Call> calls;
    int stray = 0;  // launches before any route
    void route(const MatmulShape& m, const ehcuda::MatmulRoute& r) override { calls.push_back({m, r, {}}); }
    void launch(const char* kernel, unsigned blocks, unsigned threads, size_t smem) override {
        if (calls.empty()) ++stray;
        else calls.back().launches.push_back({kernel, blocks, threads, smem});
    }
};

struct RecorderScope {
    explicit RecorderScope(Recorder& r) { ehcuda::set_launch_recorder(&r); }
    ~RecorderScope() { ehcuda::set_launch_recorder(nullptr); }
};

// What `call` must have launched, by its route.
void expect_launches(const Call& call, const std::string& what) {
    const std::vector<Launch>& got = call.launches;
    size_t i = 0;
    for (const ehcuda::KernelLaunch& k : call.route) {
        const std::string name = ehcuda::route_kernel_name(k.kernel);
        if (k.kernel == RouteKernel::Wmma) {  // one per segment group the GEMM fuses
            ASSERT_LT(i, got.size()) << what << ": no " << name;
            while (i < got.size() && got[i].kernel == name) ++i;
            continue;
        }
        const int n = k.kernel == RouteKernel::Generic ? 1 : k.reps;
        for (int r = 0; r < n; ++r, ++i) {
            if (k.bulk.prequant) {  // a token group's inputs quantized once, before each group
                ASSERT_LT(i, got.size()) << what << ": the group's quantize_tokens_kernel missing";
                EXPECT_EQ(got[i].kernel, "quantize_tokens_kernel") << what << ": launch " << i;
                ++i;
            }
            ASSERT_LT(i, got.size()) << what << ": launch " << i << " (" << name << ") missing";
            const Launch& l = got[i];
            EXPECT_EQ(l.kernel, name) << what << ": launch " << i;
            if (k.threads == 0) continue;  // sized by its own launcher (generic, cuBLAS)
            EXPECT_EQ(l.threads, unsigned(k.threads)) << what << ": " << name;
            EXPECT_EQ(l.smem, k.smem) << what << ": " << name;
            if (k.kernel == RouteKernel::GemvBulkRing) {
                EXPECT_GT(l.blocks, 0u) << what;
                EXPECT_LE(l.blocks, unsigned(k.blocks)) << what << ": the resident grid";
            } else {
                EXPECT_EQ(l.blocks, unsigned(k.blocks)) << what << ": " << name;
            }
        }
    }
    EXPECT_EQ(i, got.size()) << what << ": launches past the route (first: " << (i < got.size() ? got[i].kernel : "") << ")";
}

// Device memory of one real shape: weights (zeros: the launch, not the
// numbers, is under test), inputs for 64 tokens, outputs.
struct Operands {
    std::vector<ehcuda::DeviceBuffer> w;
    ehcuda::DeviceBuffer x, chunks, norm, y;
    ehcuda::MatmulArgs args(const GemvShape& g, int ntok) const {
        ehcuda::MatmulArgs a;
        a.nseg = g.nseg;
        int off = 0;
        for (int s = 0; s < g.nseg; ++s) {
            a.seg[s].w = {w[size_t(s)].get(), g.type[s], g.rows[s], g.cols, g.row_bytes[s]};
            a.seg[s].out_offset = off;
            off += g.rows[s];
        }
        a.cols = g.cols;
        a.x = x.as<float>();
        a.ldx = g.cols;
        a.y = y.as<float>();
        a.ldy = off;
        a.ntok = ntok;
        return a;
    }
};

Operands operands(const GemvShape& g) {
    Operands o;
    int rows = 0;
    for (int s = 0; s < g.nseg; ++s) {
        o.w.emplace_back(size_t(g.rows[s]) * g.row_bytes[s]);
        EXPECT_EQ(cudaMemset(o.w.back().get(), 0, o.w.back().size()), cudaSuccess);
        rows += g.rows[s];
    }
    o.x = ehcuda::DeviceBuffer(size_t(64) * g.cols * 4);
    EXPECT_EQ(cudaMemset(o.x.get(), 0, o.x.size()), cudaSuccess);
    o.chunks = ehcuda::DeviceBuffer(size_t(g.cols / 32) * 112 + 16);
    EXPECT_EQ(cudaMemset(o.chunks.get(), 0, o.chunks.size()), cudaSuccess);
    o.norm = ehcuda::DeviceBuffer(size_t(g.cols) * 4);
    EXPECT_EQ(cudaMemset(o.norm.get(), 0, o.norm.size()), cudaSuccess);
    o.y = ehcuda::DeviceBuffer(size_t(64) * rows * 4);
    return o;
}

ehcuda::DeviceTraits this_device() {
    int dev = 0;
    cudaDeviceProp p{};
    EXPECT_EQ(cudaGetDevice(&dev), cudaSuccess);
    EXPECT_EQ(cudaGetDeviceProperties(&p, dev), cudaSuccess);
    return {p.major, 0, p.multiProcessorCount};
}

TEST(RouteLaunch, EveryLaunchMatchesItsRoute) {
    REQUIRE_GPU();
    const ehcuda::DeviceTraits dev = this_device();
    struct Variant {
        const char* name;
        KernelPlan plan;
    };
    std::vector<Variant> variants{{"chosen", ehcuda::choose_plan(dev, false)},
                                  {"exact routing", ehcuda::choose_plan(dev, true)}};
    variants.push_back(variants[0]);
    variants.back().name = "float input";
    variants.back().plan.gemv_input = ehcuda::GemvInput::Float;
    // (bulk off: the mixed-type register launch, which the bulk kernel takes
    // over on sm_90 otherwise; mixed off: one launch per segment)
    variants.push_back(variants[0]);
    variants.back().name = "bulk off";
    variants.back().plan.gemv_bulk = false;
    variants.push_back(variants[0]);
    variants.back().name = "mixed off";
    variants.back().plan.gemv_mixed = false;
    // token groups of up to 8, each weight chunk decoded once, RMSNorm
    // groups, inputs under 2048 columns staged in each block, long rows in
    // slices of K
    variants.push_back(variants[0]);
    variants.back().name = "groups once norm";
    variants.back().plan.bulk_max_tokens = ehcuda::kBulkMaxTokens;
    variants.back().plan.bulk_group_once = true;
    variants.back().plan.bulk_group_norm = true;
    variants.back().plan.bulk_group_stage_cols = 2048;
    variants.back().plan.bulk_group_kslice = true;  // (Llama-3.1-8B's ffn_down)
    // every one-token bulk matmul as the slice ring (bulk_slices 2)
    variants.push_back(variants[0]);
    variants.back().name = "slice ring";
    variants.back().plan.bulk_slices = 2;
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    int max_cols = 0;
    for (const RealShape& r : kRealShapes) max_cols = std::max(max_cols, r.cols);
    ehcuda::PrefillShape ps;
    ps.max_tokens = 64;
    ps.max_cols = max_cols;
    ehcuda::PrefillWorkspace ws(ps, stream, nullptr);
    int calls = 0, kinds[7] = {};
    for (const RealShape& r : kRealShapes) {
        const GemvShape g = shape_of(r);
        bool supported = true;
        for (int s = 0; s < g.nseg; ++s) supported &= ehcuda::matmul_type_supported(g.type[s]);
        if (!supported) continue;  // MXFP4 experts: the MoE kernels' own
        const Operands o = operands(g);
        for (const Variant& v : variants) {
            ehcuda::PlanScope scope(v.plan);
            ws.set_min_tokens(ehcuda::step_per_token_max(v.plan, false) + 1);
            for (int n : {1, 8, 64}) {
                const std::string what = std::string(v.name) + " " + r.model + " " + r.kind + " step of " + std::to_string(n);
                const ehcuda::StepRoute sr = ehcuda::route_step_matmul(v.plan, dev, g, n, false);
                Recorder rec;
                {
                    RecorderScope on(rec);
                    ehcuda::MatmulArgs a = o.args(g, sr.per_token ? 1 : n);
                    a.prefill = &ws;
                    for (int t = 0; t < (sr.per_token ? n : 1); ++t) {
                        a.x = o.x.as<float>() + size_t(t) * g.cols;
                        a.y = o.y.as<float>() + size_t(t) * a.ldy;
                        ehcuda::matmul(a, stream);
                    }
                    if (n == 1 && ehcuda::gemv_takes_chunks(g.type[0])) {
                        ehcuda::MatmulArgs c = o.args(g, 1);
                        c.xmode = ehcuda::XMode::Chunks;
                        c.x = o.chunks.as<float>();
                        bool all = true;
                        for (int s = 0; s < g.nseg; ++s) all &= ehcuda::gemv_takes_chunks(g.type[s]);
                        if (all) ehcuda::matmul(c, stream);
                    }
                    if (n == 1 || (n <= 8 && v.plan.bulk_group_norm)) {
                        ehcuda::MatmulArgs f = o.args(g, n);
                        if (n > 1) f.prefill = &ws;
                        f.xmode = ehcuda::XMode::RmsNorm;
                        f.norm_w = o.norm.as<float>();
                        f.norm_eps = 1e-6f;
                        ehcuda::matmul(f, stream);
                    }
                }
                ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << what;
                EXPECT_EQ(rec.stray, 0) << what;
                ASSERT_GE(rec.calls.size(), size_t(sr.per_token ? n : 1)) << what;
                for (size_t i = 0; i < rec.calls.size(); ++i) {
                    const Call& c = rec.calls[i];
                    // The call's route is the step's, computed here from the shape alone.
                    if (i < size_t(sr.per_token ? n : 1))
                        EXPECT_EQ(ehcuda::describe_route(v.plan, c.m, c.route), ehcuda::describe_route(v.plan, c.m, sr.route))
                            << what;
                    const ehcuda::MatmulRoute again = ehcuda::route_matmul(v.plan, dev, c.m);
                    EXPECT_EQ(ehcuda::describe_route(v.plan, c.m, c.route), ehcuda::describe_route(v.plan, c.m, again))
                        << what;
                    expect_launches(c, what + " call " + std::to_string(i));
                    for (const ehcuda::KernelLaunch& k : c.route) ++kinds[int(k.kernel)];
                    ++calls;
                }
            }
        }
    }
    cudaStreamDestroy(stream);
    // The table reached every kernel but the generic one.
    for (RouteKernel k : {RouteKernel::GemvBulk, RouteKernel::GemvBulkRing, RouteKernel::Gemv, RouteKernel::GemvMixed,
                          RouteKernel::Cublas})
        EXPECT_GT(kinds[int(k)], 0) << "RouteKernel " << int(k) << ", " << ehcuda::route_kernel_name(k)
                                    << (dev.cc_major < 9 ? " (needs sm_90)" : "");
    EXPECT_GT(calls, 500);
}

// The generic kernel's route too: an input not in the fast kernels' form.
TEST(RouteLaunch, GenericRoute) {
    REQUIRE_GPU();
    const ehcuda::DeviceTraits dev = this_device();
    const KernelPlan p = ehcuda::choose_plan(dev, false);
    ehcuda::PlanScope scope(p);
    const GemvShape g = shape_of(kRealShapes[0]);  // Qwen2.5-0.5B's Q, K, V of two types
    const Operands o = operands(g);
    Recorder rec;
    {
        RecorderScope on(rec);
        ehcuda::MatmulArgs a = o.args(g, 2);
        a.x = o.x.as<float>() + 1;  // not 16-byte aligned
        ehcuda::matmul(a, nullptr);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(rec.calls.size(), 1u);
    EXPECT_EQ(rec.calls[0].route.launch[0].kernel, RouteKernel::Generic);
    EXPECT_EQ(rec.calls[0].route.n, 3);  // Q5_0, Q5_0 and Q8_0: one launch per segment
    EXPECT_FALSE(rec.calls[0].m.aligned);
    expect_launches(rec.calls[0], "generic");
}

}  // namespace
