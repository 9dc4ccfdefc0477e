// rope_attention_decode (RoPE + KV store + split-K attention + merge in one
// launch) against the two-kernel path it replaces (rope_store_kv +
// attention_decode) and against host math: cache contents at the new
// position, outputs, counters back to 0, bitwise reproducibility, and a
// captured graph replayed over consecutive positions.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include <engine_host/plugin_abi.hpp>
#include <ehcuda/attention_paged.hpp>
#include <ehcuda/gpt_ops.hpp>
#include <ehcuda/kernels.hpp>

#include "gpu_util.hpp"
#include "host_reference.hpp"

namespace ehtest {
namespace {

struct FusedCase {
    int hd, H, KV, len, window;
    bool neox;
    int n_rot;
};

std::string name_of(const FusedCase& c) {
    return "hd" + std::to_string(c.hd) + "_H" + std::to_string(c.H) + "_KV" + std::to_string(c.KV) + "_len" +
           std::to_string(c.len) + "_win" + std::to_string(c.window) + (c.neox ? "_neox" : "_norm") + "_rot" +
           std::to_string(c.n_rot);
}

// Stands in for whatever the cache held at positions not yet written: were a
// kernel to read the new position from the cache instead of the token's own
// K/V, scores and outputs would be far off.
constexpr float kSentinel = 300.0f;

// One token's RoPE in double, pairs as RopeArgs documents.
void host_rope(float* v, int n_rot, bool neox, int pos, double base) {
    for (int i = 0; i < n_rot / 2; ++i) {
        const double th = pos * std::pow(base, -2.0 * i / n_rot);
        const int a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
        const double x0 = v[a], x1 = v[b];
        v[a] = float(x0 * std::cos(th) - x1 * std::sin(th));
        v[b] = float(x0 * std::sin(th) + x1 * std::cos(th));
    }
}

// Attention of one (already rotated) query row over an FP16 cache.
std::vector<float> host_decode(const std::vector<float>& q, const std::vector<__half>& kc, const std::vector<__half>& vc,
                               int H, int KV, int hd, int pos, int window) {
    std::vector<float> out(static_cast<size_t>(H) * hd);
    const double scale = 1 / std::sqrt(double(hd));
    const int k0 = window > 0 ? std::max(0, pos - window + 1) : 0;
    for (int h = 0; h < H; ++h) {
        const int g = h / (H / KV);
        std::vector<double> s;
        double mx = -1e300;
        for (int j = k0; j <= pos; ++j) {
            double d = 0;
            for (int e = 0; e < hd; ++e)
                d += double(q[static_cast<size_t>(h * hd + e)]) * __half2float(kc[(static_cast<size_t>(j) * KV + g) * hd + e]);
            s.push_back(d * scale);
            mx = std::max(mx, d * scale);
        }
        double z = 0;
        for (auto& v : s) z += (v = std::exp(v - mx));
        for (int e = 0; e < hd; ++e) {
            double acc = 0;
            for (int j = k0; j <= pos; ++j)
                acc += s[static_cast<size_t>(j - k0)] * __half2float(vc[(static_cast<size_t>(j) * KV + g) * hd + e]);
            out[static_cast<size_t>(h * hd + e)] = float(acc / z);
        }
    }
    return out;
}

// A launch's head shape (RopeArgs, RopeTableArgs, AttnArgs, PagedAttnArgs, DecodeAttnArgs).
template <class Args>
void set_heads(Args& a, int n_head, int n_kv, int head_dim) {
    a.n_head = n_head;
    a.n_kv = n_kv;
    a.head_dim = head_dim;
}
// A paged launch's positions and block tables (device).
template <class Args>
void set_tables(Args& a, const ehcuda::DeviceBuffer& dpos, const ehcuda::DeviceBuffer& dtab,
                const ehcuda::DeviceBuffer& dtables) {
    a.d_pos = dpos.as<int32_t>();
    a.d_table = dtab.as<int32_t>();
    a.tables = dtables.as<int32_t>();
}

// The fused launch's arguments for case c over these buffers: qkv rows,
// K and V caches, output, split scratch and counters (the positions, and
// the paged form's rows, are the caller's).
ehcuda::DecodeAttnArgs decode_args(const FusedCase& c, int nsplit, const ehcuda::DeviceBuffer& qkv,
                                   const ehcuda::DeviceBuffer& kc, const ehcuda::DeviceBuffer& vc,
                                   const ehcuda::DeviceBuffer& out, const ehcuda::DeviceBuffer& scratch,
                                   const ehcuda::DeviceBuffer& counters) {
    ehcuda::DecodeAttnArgs a;
    a.qkv = qkv.as<float>();
    set_heads(a, c.H, c.KV, c.hd);
    a.n_rot = c.n_rot;
    a.neox = c.neox;
    a.freq_base = 10000.0f;
    a.k_cache = kc.as<__half>();
    a.v_cache = vc.as<__half>();
    a.window = c.window;
    a.scale = 1 / std::sqrt(float(c.hd));
    a.out = out.as<float>();
    a.nsplit = nsplit;
    a.scratch = scratch.as<float>();
    a.counters = counters.as<uint32_t>();
    return a;
}

// Device state of one decode step: the token's qkv row, both caches
// (capacity cap positions), the output, split scratch and counters.
struct Step {
    ehcuda::DeviceBuffer qkv, kc, vc, pos, out, scratch, counters;
    ehcuda::DecodeAttnArgs args(const FusedCase& c, int nsplit) const {
        ehcuda::DecodeAttnArgs a = decode_args(c, nsplit, qkv, kc, vc, out, scratch, counters);
        a.d_pos0 = pos.as<int32_t>();
        return a;
    }
};

// K and V caches of `size` halves holding kSentinel, the first `filled`
// random (K and V drawn in turn).
void sentinel_caches(std::vector<__half>& kc, std::vector<__half>& vc, size_t size, size_t filled, std::mt19937& rng,
                     std::normal_distribution<float>& nd) {
    kc.assign(size, __float2half(kSentinel));
    vc.assign(size, __float2half(kSentinel));
    for (size_t i = 0; i < filled; ++i) {
        kc[i] = __float2half(nd(rng));
        vc[i] = __float2half(nd(rng));
    }
}

// Rows of these lengths on a paged pool (blocks of kPagedBlockTokens): each
// row's block table, taken from `ids` in order, and its new key's position
// (len - 1) and pool row.
struct PagedRows {
    static constexpr int B = ehcuda::kPagedBlockTokens;
    std::vector<int32_t> pos, store, table_at, tables;
    PagedRows(const std::vector<int>& lens, const std::vector<int32_t>& ids)
        : pos(lens.size()), store(lens.size()), table_at(lens.size()) {
        for (size_t r = 0; r < lens.size(); ++r) {
            table_at[r] = int32_t(tables.size());
            for (int b = 0; b < (lens[r] + B - 1) / B; ++b) tables.push_back(ids[tables.size()]);
            pos[r] = lens[r] - 1;
            store[r] = int32_t(pool_row(r, pos[r]));
        }
    }
    size_t pool_row(size_t r, int key) const { return size_t(tables[size_t(table_at[r] + key / B)]) * B + key % B; }
    // Every row's blocks, shuffled over a pool of `spare` more.
    static std::vector<int32_t> shuffled_blocks(const std::vector<int>& lens, int spare, std::mt19937& rng) {
        int nblk = 0;
        for (int len : lens) nblk += (len + B - 1) / B;
        std::vector<int32_t> ids(size_t(nblk + spare));
        for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
        std::shuffle(ids.begin(), ids.end(), rng);
        return ids;
    }
};

// The paged form's rows in `a`: R rows of qkv (ld apart) and output (n_out
// apart), their positions, pool rows and block tables (device).
void set_paged(ehcuda::DecodeAttnArgs& a, int R, int ld, int n_out, const ehcuda::DeviceBuffer& dpos,
               const ehcuda::DeviceBuffer& dstore, const ehcuda::DeviceBuffer& dtab, const ehcuda::DeviceBuffer& dtables) {
    a.paged = true;
    a.nrows = R;
    a.ldqkv = ld;
    a.ldo = n_out;
    a.d_rows = dstore.as<int32_t>();
    set_tables(a, dpos, dtab, dtables);
}

Step make_step(const FusedCase& c, int nsplit, const std::vector<float>& qkv, const std::vector<__half>& kc,
               const std::vector<__half>& vc, int pos) {
    Step s;
    s.qkv = to_device(qkv);
    s.kc = to_device(kc);
    s.vc = to_device(vc);
    s.pos = to_device(std::vector<int32_t>{pos});
    s.out = to_device(std::vector<float>(static_cast<size_t>(c.H) * c.hd, -7.0f));
    s.scratch = ehcuda::DeviceBuffer(ehcuda::attention_decode_scratch_floats(c.H, c.hd, nsplit) * 4);
    s.counters = to_device(std::vector<uint32_t>(ehcuda::attention_decode_counters(c.H), 0u));
    return s;
}

// A step for the argument checks: zeros, 16 cache positions, the new key at 9.
Step zero_step(const FusedCase& c, int nsplit) {
    std::vector<float> qkv(static_cast<size_t>((c.H + 2 * c.KV) * c.hd));
    std::vector<__half> kc(static_cast<size_t>(16) * c.KV * c.hd);
    return make_step(c, nsplit, qkv, kc, kc, 9);
}

// The path rope_attention_decode replaces, on the same buffers.
void run_unfused(const FusedCase& c, int nsplit, const Step& s) {
    ehcuda::RopeArgs r;
    r.qkv = s.qkv.as<float>();
    r.ld = (c.H + 2 * c.KV) * c.hd;
    set_heads(r, c.H, c.KV, c.hd);
    r.n_rot = c.n_rot;
    r.neox = c.neox;
    r.freq_base = 10000.0f;
    r.d_pos0 = s.pos.as<int32_t>();
    r.k_cache = s.kc.as<__half>();
    r.v_cache = s.vc.as<__half>();
    ehcuda::rope_store_kv(r, nullptr);
    ehcuda::AttnArgs a;
    a.q = s.qkv.as<float>();
    a.ldq = r.ld;
    a.k_cache = s.kc.as<__half>();
    a.v_cache = s.vc.as<__half>();
    set_heads(a, c.H, c.KV, c.hd);
    a.d_pos0 = s.pos.as<int32_t>();
    a.window = c.window;
    a.scale = 1 / std::sqrt(float(c.hd));
    a.out = s.out.as<float>();
    a.ldo = c.H * c.hd;
    ehcuda::attention_decode(a, s.scratch.as<float>(), nsplit, nullptr);
}

bool same_bits(const std::vector<__half>& a, const std::vector<__half>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(__half)) == 0;
}

// With out_chunks, the launch writes the same `out` and, for every integer
// input form, the chunks a single-token GEMV would stage from it: a Q8_0
// output projection reading the chunks (XMode::Chunks) gives the bits it
// gives reading `out` (XMode::Plain).
void check_chunk_output(const FusedCase& c, int nsplit, const std::vector<float>& qkv, const std::vector<__half>& kc,
                        const std::vector<__half>& vc, int pos, const std::vector<float>& fout) {
    const int n_out = c.H * c.hd, rows = 40;
    std::mt19937 rng(uint32_t(n_out + nsplit));
    const auto w = random_rows(EH_TYPE_Q8_0, rows, n_out, rng);
    const ehcuda::DeviceBuffer dw = to_device(w);
    for (auto in : {ehcuda::GemvInput::Int8, ehcuda::GemvInput::Int16, ehcuda::GemvInput::Int16x2}) {
        SCOPED_TRACE("input form " + std::to_string(int(in)));
        InputGuard guard(in);
        Step s = make_step(c, nsplit, qkv, kc, vc, pos);
        ehcuda::DeviceBuffer chunks(ehcuda::gemv_chunk_bytes(n_out));
        auto a = s.args(c, nsplit);
        a.out_chunks = chunks.get();
        ASSERT_NO_THROW(ehcuda::rope_attention_decode(a, nullptr));
        const auto out = to_host<float>(s.out, size_t(n_out));
        ASSERT_EQ(std::memcmp(out.data(), fout.data(), out.size() * 4), 0) << "out differs with chunks";
        ehcuda::DeviceBuffer y1(rows * 4), y2(rows * 4);
        ehcuda::MatmulArgs m;
        m.seg[0].w = {dw.get(), EH_TYPE_Q8_0, rows, n_out, row_size(EH_TYPE_Q8_0, n_out)};
        m.cols = n_out;
        m.x = s.out.as<float>();
        m.ldx = n_out;
        m.y = y1.as<float>();
        m.ldy = rows;
        ASSERT_NO_THROW(ehcuda::matmul(m, nullptr));
        m.x = chunks.as<float>();
        m.xmode = ehcuda::XMode::Chunks;
        m.y = y2.as<float>();
        ASSERT_NO_THROW(ehcuda::matmul(m, nullptr));
        const auto v1 = to_host<float>(y1, rows), v2 = to_host<float>(y2, rows);
        ASSERT_EQ(std::memcmp(v1.data(), v2.data(), v1.size() * 4), 0) << "chunks differ from staging the output";
    }
}

class FusedDecodeTest : public ::testing::TestWithParam<FusedCase> {};

TEST_P(FusedDecodeTest, MatchesUnfusedAndHost) {
    REQUIRE_GPU();
    const FusedCase c = GetParam();
    const int pos = c.len - 1, cap = c.len + 3;
    const int ld = (c.H + 2 * c.KV) * c.hd;
    const size_t row = static_cast<size_t>(c.KV) * c.hd;
    std::mt19937 rng(static_cast<uint32_t>(c.hd * 1000003 + c.H * 1009 + c.len * 31 + c.n_rot + c.neox));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> qkv(static_cast<size_t>(ld));
    for (auto& v : qkv) v = nd(rng);
    std::vector<__half> kc, vc;
    sentinel_caches(kc, vc, static_cast<size_t>(cap) * row, static_cast<size_t>(pos) * row, rng, nd);

    // Host: rotated q; the cache with the new token's rotated K and its V.
    std::vector<float> q(qkv.begin(), qkv.begin() + c.H * c.hd);
    for (int h = 0; h < c.H; ++h) host_rope(q.data() + h * c.hd, c.n_rot, c.neox, pos, 10000.0);
    std::vector<__half> kref = kc, vref = vc;
    for (int g = 0; g < c.KV; ++g) {
        std::vector<float> k(qkv.begin() + (c.H + g) * c.hd, qkv.begin() + (c.H + g + 1) * c.hd);
        host_rope(k.data(), c.n_rot, c.neox, pos, 10000.0);
        for (int e = 0; e < c.hd; ++e) {
            kref[static_cast<size_t>(pos) * row + g * c.hd + e] = __float2half(k[static_cast<size_t>(e)]);
            vref[static_cast<size_t>(pos) * row + g * c.hd + e] =
                __float2half(qkv[static_cast<size_t>((c.H + c.KV + g) * c.hd + e)]);
        }
    }
    const auto ref = host_decode(q, kref, vref, c.H, c.KV, c.hd, pos, c.window);

    const int n_out = c.H * c.hd;
    for (int nsplit : {1, 3, ehcuda::attention_decode_splits(uint32_t(c.len + 200)), 64}) {
        SCOPED_TRACE("nsplit " + std::to_string(nsplit));
        Step f = make_step(c, nsplit, qkv, kc, vc, pos);
        ASSERT_NO_THROW(ehcuda::rope_attention_decode(f.args(c, nsplit), nullptr));
        GPU_OK(cudaDeviceSynchronize());
        const auto fout = to_host<float>(f.out, static_cast<size_t>(n_out));
        const auto fk = to_host<__half>(f.kc, kc.size());
        const auto fv = to_host<__half>(f.vc, vc.size());
        const auto fcnt = to_host<uint32_t>(f.counters, ehcuda::attention_decode_counters(c.H));
        for (uint32_t v : fcnt) ASSERT_EQ(v, 0u) << "a split counter was left non-zero";
        if (ehcuda::attention_head_dim_fast(c.hd)) {
            // Q is rotated in registers; the qkv row stays as it was.
            const auto fq = to_host<float>(f.qkv, qkv.size());
            ASSERT_EQ(std::memcmp(fq.data(), qkv.data(), qkv.size() * 4), 0) << "qkv was written";
        }

        Step u = make_step(c, nsplit, qkv, kc, vc, pos);
        run_unfused(c, nsplit, u);
        GPU_OK(cudaDeviceSynchronize());
        const auto uout = to_host<float>(u.out, static_cast<size_t>(n_out));
        const auto uk = to_host<__half>(u.kc, kc.size());
        const auto uv = to_host<__half>(u.vc, vc.size());

        // Same rotation code, so the same cache bits; all other positions
        // untouched.
        EXPECT_TRUE(same_bits(fk, uk)) << "K cache differs from rope_store_kv's";
        EXPECT_TRUE(same_bits(fv, uv)) << "V cache differs from rope_store_kv's";
        for (size_t i = 0; i < kc.size(); ++i) {
            const float want_k = __half2float(kref[i]), want_v = __half2float(vref[i]);
            ASSERT_NEAR(__half2float(fk[i]), want_k, 2e-3 * (1 + std::fabs(want_k))) << "K cache at " << i;
            ASSERT_EQ(__half2float(fv[i]), want_v) << "V cache at " << i;
        }
        for (int i = 0; i < n_out; ++i) {
            ASSERT_NEAR(fout[static_cast<size_t>(i)], ref[static_cast<size_t>(i)], 2e-3 * (1 + std::fabs(ref[static_cast<size_t>(i)])))
                << "vs host at " << i;
            ASSERT_NEAR(fout[static_cast<size_t>(i)], uout[static_cast<size_t>(i)], 1e-4 * (1 + std::fabs(uout[static_cast<size_t>(i)])))
                << "vs unfused at " << i;
        }

        // Run to run: the same bits (a second launch over the same state
        // also checks the counters were left ready for it). The fallback
        // rotates Q in qkv, so it cannot run twice on one row.
        if (!ehcuda::attention_head_dim_fast(c.hd)) continue;
        check_chunk_output(c, nsplit, qkv, kc, vc, pos, fout);
        ASSERT_NO_THROW(ehcuda::rope_attention_decode(f.args(c, nsplit), nullptr));
        const auto fout2 = to_host<float>(f.out, static_cast<size_t>(n_out));
        EXPECT_EQ(std::memcmp(fout.data(), fout2.data(), fout.size() * 4), 0) << "second run differs";
        EXPECT_TRUE(same_bits(fk, to_host<__half>(f.kc, kc.size())));
    }
}

std::vector<FusedCase> fused_cases() {
    std::vector<FusedCase> v;
    int idx = 0;
    for (int hd : {64, 96, 128})
        for (auto [H, KV] : {std::pair{4, 4}, std::pair{14, 2}, std::pair{16, 2}})
            for (int len : {1, 63, 64, 65, 577}) {
                ++idx;
                const bool neox = idx % 2;
                const int n_rot = idx % 3 == 0 ? hd / 2 : hd;  // partial rotary every third
                const int window = idx % 4 == 1 ? 40 : idx % 4 == 3 ? 100 : 0;
                v.push_back({hd, H, KV, len, window, neox, n_rot});
            }
    // Head dim 256 (4 keys per warp round), a window a split boundary away
    // from the new key, a short rotary part, and a head dim the fallback
    // (rope_store_kv + generic attention) takes.
    v.push_back({256, 8, 1, 577, 0, true, 256});
    v.push_back({256, 4, 4, 65, 0, false, 64});
    v.push_back({64, 14, 2, 577, 64, true, 64});
    v.push_back({64, 14, 2, 300, 129, false, 16});
    v.push_back({128, 16, 2, 1000, 0, true, 128});
    v.push_back({64, 14, 2, 2200, 0, false, 64});  // 35 splits: past the one-round merge's 32
    v.push_back({32, 8, 2, 65, 0, true, 32});
    return v;
}

INSTANTIATE_TEST_SUITE_P(Shapes, FusedDecodeTest, ::testing::ValuesIn(fused_cases()),
                         [](const ::testing::TestParamInfo<FusedCase>& i) { return name_of(i.param); });

// Decode as a captured step runs it: the fused launch captured once in a
// CUDA graph, replayed for consecutive positions (each step's cache row is
// what the next steps attend); the unfused path alongside on its own cache.
TEST(FusedDecode, GraphReplayOverConsecutivePositions) {
    REQUIRE_GPU();
    const FusedCase c{64, 14, 2, 0, 0, true, 64};
    const int pos0 = 120, steps = 12, cap = pos0 + steps;
    const int nsplit = ehcuda::attention_decode_splits(uint32_t(cap));
    const int ld = (c.H + 2 * c.KV) * c.hd;
    const size_t row = static_cast<size_t>(c.KV) * c.hd;
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<__half> kc, vc;
    sentinel_caches(kc, vc, static_cast<size_t>(cap) * row, static_cast<size_t>(pos0) * row, rng, nd);
    std::vector<float> qkv(static_cast<size_t>(ld));
    Step f = make_step(c, nsplit, qkv, kc, vc, pos0);
    Step u = make_step(c, nsplit, qkv, kc, vc, pos0);

    cudaStream_t st;
    GPU_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    GPU_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    ehcuda::rope_attention_decode(f.args(c, nsplit), st);
    GPU_OK(cudaStreamEndCapture(st, &graph));
    GPU_OK(cudaGraphInstantiate(&exec, graph, 0));

    for (int step = 0; step < steps; ++step) {
        const int32_t pos = pos0 + step;
        for (auto& v : qkv) v = nd(rng);
        for (Step* s : {&f, &u}) {
            GPU_OK(cudaMemcpy(s->qkv.get(), qkv.data(), qkv.size() * 4, cudaMemcpyHostToDevice));
            GPU_OK(cudaMemcpy(s->pos.get(), &pos, 4, cudaMemcpyHostToDevice));
        }
        GPU_OK(cudaGraphLaunch(exec, st));
        GPU_OK(cudaStreamSynchronize(st));
        run_unfused(c, nsplit, u);
        GPU_OK(cudaDeviceSynchronize());
        const auto fo = to_host<float>(f.out, static_cast<size_t>(c.H) * c.hd);
        const auto uo = to_host<float>(u.out, fo.size());
        for (size_t i = 0; i < fo.size(); ++i)
            ASSERT_NEAR(fo[i], uo[i], 1e-4 * (1 + std::fabs(uo[i]))) << "step " << step << " at " << i;
        for (uint32_t v : to_host<uint32_t>(f.counters, ehcuda::attention_decode_counters(c.H)))
            ASSERT_EQ(v, 0u) << "step " << step;
    }
    EXPECT_TRUE(same_bits(to_host<__half>(f.kc, kc.size()), to_host<__half>(u.kc, kc.size())));
    EXPECT_TRUE(same_bits(to_host<__half>(f.vc, vc.size()), to_host<__half>(u.vc, vc.size())));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
}

// The cache rows earlier steps wrote are read before the kernel's PDL wait
// (early 1 and 2) and a warp's next key group is loaded before the current
// one is scored (pipe): neither may change a bit. The qkv row comes from a
// GEMV launched just before on the same stream, as in a decode step, so the
// attention's blocks start while its producer still runs.
TEST(FusedDecode, EarlyAndPipelinedKeyLoadsGiveTheSameBits) {
    REQUIRE_GPU();
    struct Restore {
        ~Restore() {
            ehtest::set_attention_early(2);
            ehtest::set_attention_pipe(true);
        }
    } restore;
    cudaStream_t st = nullptr;
    GPU_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    // hd 96 at 8 keys per warp round and hd 64 at 16: three splits of ~190
    // keys give every warp several key groups.
    for (const FusedCase c : {FusedCase{96, 8, 8, 577, 0, false, 96}, FusedCase{64, 14, 2, 577, 0, true, 64}}) {
        SCOPED_TRACE(name_of(c));
        const int pos = c.len - 1, cap = c.len + 3, nsplit = 3, n_in = 256;
        const int ld = (c.H + 2 * c.KV) * c.hd;
        const size_t row = static_cast<size_t>(c.KV) * c.hd;
        std::mt19937 rng(static_cast<uint32_t>(c.hd + c.H));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<__half> kc, vc;
        sentinel_caches(kc, vc, static_cast<size_t>(cap) * row, static_cast<size_t>(pos) * row, rng, nd);
        std::vector<float> x(static_cast<size_t>(n_in));
        for (auto& v : x) v = nd(rng);
        const ehcuda::DeviceBuffer dw = to_device(random_rows(EH_TYPE_Q8_0, ld, n_in, rng, 0.2f)), dx = to_device(x);
        auto run = [&](int early, bool pipe, bool sync_between, std::vector<float>& out, std::vector<__half>& k,
                       std::vector<__half>& v) {
            ehtest::set_attention_early(early);
            ehtest::set_attention_pipe(pipe);
            Step s = make_step(c, nsplit, std::vector<float>(static_cast<size_t>(ld), 0.0f), kc, vc, pos);
            ehcuda::MatmulArgs m;
            m.seg[0].w = {dw.get(), EH_TYPE_Q8_0, ld, n_in, row_size(EH_TYPE_Q8_0, n_in)};
            m.cols = n_in;
            m.x = dx.as<float>();
            m.ldx = n_in;
            m.y = s.qkv.as<float>();
            m.ldy = ld;
            ASSERT_NO_THROW(ehcuda::matmul(m, st));
            if (sync_between) {
                GPU_OK(cudaStreamSynchronize(st));
            }
            ASSERT_NO_THROW(ehcuda::rope_attention_decode(s.args(c, nsplit), st));
            GPU_OK(cudaStreamSynchronize(st));
            out = to_host<float>(s.out, static_cast<size_t>(c.H) * c.hd);
            k = to_host<__half>(s.kc, kc.size());
            v = to_host<__half>(s.vc, vc.size());
        };
        std::vector<float> want;
        std::vector<__half> kw, vw;
        run(0, false, true, want, kw, vw);
        for (float f : want) ASSERT_TRUE(std::isfinite(f));
        for (auto [early, pipe] : {std::pair{0, false}, std::pair{1, false}, std::pair{1, true}, std::pair{2, false},
                                   std::pair{2, true}}) {
            SCOPED_TRACE("early " + std::to_string(early) + " pipe " + std::to_string(pipe));
            std::vector<float> got;
            std::vector<__half> kg, vg;
            run(early, pipe, false, got, kg, vg);
            EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << "output differs";
            EXPECT_TRUE(same_bits(kg, kw)) << "K cache differs";
            EXPECT_TRUE(same_bits(vg, vw)) << "V cache differs";
        }
    }
    GPU_OK(cudaStreamDestroy(st));
}

// The paged form (a batched step's decode rows): each row's output and
// stored K/V equal, bit for bit, the one-row kernel's on a contiguous cache
// holding the same keys with the same splits; rows of different lengths
// (one position, block boundaries, past a window) in one launch, their
// blocks scattered over the pool; counters back to 0; a second launch gives
// the same bits.
TEST(FusedDecode, PagedRowsMatchOneRowOnAContiguousCache) {
    REQUIRE_GPU();
    constexpr int B = ehcuda::kPagedBlockTokens;
    for (const FusedCase c : {FusedCase{64, 14, 2, 0, 0, true, 64}, FusedCase{128, 8, 8, 0, 100, false, 64},
                              FusedCase{96, 4, 2, 0, 0, false, 96}}) {
        SCOPED_TRACE(name_of(c));
        const std::vector<int> lens = {1, 16, 17, 64, 65, 300, 577};
        const int R = int(lens.size());
        const int ld = (c.H + 2 * c.KV) * c.hd, n_out = c.H * c.hd;
        const size_t row = static_cast<size_t>(c.KV) * c.hd;
        std::mt19937 rng(uint32_t(c.hd * 7 + c.H));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        // Block ids: every row's blocks, shuffled over a pool with spares.
        const std::vector<int32_t> ids = PagedRows::shuffled_blocks(lens, 5, rng);
        const PagedRows paged(lens, ids);
        const std::vector<int32_t>&pos = paged.pos, &store = paged.store;
        std::vector<__half> kpool(ids.size() * B * row, __float2half(kSentinel)), vpool(kpool.size(), __float2half(kSentinel));
        std::vector<float> qkv(size_t(R) * ld);
        const size_t nr = lens.size();
        std::vector<std::vector<__half>> kc(nr), vc(nr);
        for (int r = 0; r < R; ++r) {
            const int len = lens[size_t(r)], p = len - 1;
            for (int i = 0; i < ld; ++i) qkv[size_t(r) * ld + i] = nd(rng);
            kc[size_t(r)].assign(size_t(len + 3) * row, __float2half(kSentinel));
            vc[size_t(r)] = kc[size_t(r)];
            for (int key = 0; key < p; ++key)
                for (size_t e = 0; e < row; ++e) {
                    const __half k = __float2half(nd(rng)), v = __float2half(nd(rng));
                    const size_t at = paged.pool_row(size_t(r), key) * row + e;
                    kc[size_t(r)][size_t(key) * row + e] = kpool[at] = k;
                    vc[size_t(r)][size_t(key) * row + e] = vpool[at] = v;
                }
        }
        for (int nsplit : {1, 4, 11}) {
            SCOPED_TRACE("nsplit " + std::to_string(nsplit));
            const ehcuda::DeviceBuffer dq = to_device(qkv), dk = to_device(kpool), dv = to_device(vpool),
                                       dpos = to_device(pos), dstore = to_device(store), dtab = to_device(paged.table_at),
                                       dtables = to_device(paged.tables);
            ehcuda::DeviceBuffer out = to_device(std::vector<float>(size_t(R) * n_out, -7.0f));
            ehcuda::DeviceBuffer scratch(ehcuda::attention_decode_scratch_floats(R * c.H, c.hd, nsplit) * 4);
            ehcuda::DeviceBuffer counters = to_device(std::vector<uint32_t>(ehcuda::attention_decode_counters(c.H, R), 0u));
            ehcuda::DecodeAttnArgs a = decode_args(c, nsplit, dq, dk, dv, out, scratch, counters);
            set_paged(a, R, ld, n_out, dpos, dstore, dtab, dtables);
            ASSERT_NO_THROW(ehcuda::rope_attention_decode(a, nullptr));
            GPU_OK(cudaDeviceSynchronize());
            const auto pout = to_host<float>(out, size_t(R) * n_out);
            const auto pk = to_host<__half>(dk, kpool.size()), pv = to_host<__half>(dv, vpool.size());
            for (uint32_t v : to_host<uint32_t>(counters, size_t(R) * c.H)) ASSERT_EQ(v, 0u) << "a split counter was left non-zero";
            for (int r = 0; r < R; ++r) {
                SCOPED_TRACE("row " + std::to_string(r) + " len " + std::to_string(lens[size_t(r)]));
                const std::vector<float> q1(qkv.begin() + size_t(r) * ld, qkv.begin() + size_t(r + 1) * ld);
                Step one = make_step(c, nsplit, q1, kc[size_t(r)], vc[size_t(r)], pos[size_t(r)]);
                ASSERT_NO_THROW(ehcuda::rope_attention_decode(one.args(c, nsplit), nullptr));
                const auto o1 = to_host<float>(one.out, size_t(n_out));
                EXPECT_EQ(std::memcmp(o1.data(), pout.data() + size_t(r) * n_out, size_t(n_out) * 4), 0) << "output differs";
                const auto k1 = to_host<__half>(one.kc, kc[size_t(r)].size()), v1 = to_host<__half>(one.vc, vc[size_t(r)].size());
                EXPECT_EQ(std::memcmp(k1.data() + size_t(pos[size_t(r)]) * row, pk.data() + size_t(store[size_t(r)]) * row,
                                      row * sizeof(__half)), 0) << "stored K differs";
                EXPECT_EQ(std::memcmp(v1.data() + size_t(pos[size_t(r)]) * row, pv.data() + size_t(store[size_t(r)]) * row,
                                      row * sizeof(__half)), 0) << "stored V differs";
            }
            // Every pool row but the stored ones is as it was.
            std::vector<bool> stored(ids.size() * B, false);
            for (int32_t s : store) stored[size_t(s)] = true;
            for (size_t pr = 0; pr < stored.size(); ++pr) {
                if (stored[pr]) continue;
                ASSERT_EQ(std::memcmp(pk.data() + pr * row, kpool.data() + pr * row, row * sizeof(__half)), 0) << "pool row " << pr;
            }
            ASSERT_NO_THROW(ehcuda::rope_attention_decode(a, nullptr));
            const auto pout2 = to_host<float>(out, pout.size());
            EXPECT_EQ(std::memcmp(pout.data(), pout2.data(), pout.size() * 4), 0) << "second launch differs";
        }
    }
}

// gpt-oss's form of the paged launch (RoPE from a frequency table scaled by
// attn_factor, per-head sinks, a window): against rope_table_store_kv +
// attention_paged, the two kernels it replaces in a batched step, over the
// same pool: the same K/V bits stored, outputs within float rounding.
TEST(FusedDecode, PagedTableRopeAndSinksMatchTheTwoKernelPath) {
    REQUIRE_GPU();
    constexpr int B = ehcuda::kPagedBlockTokens;
    const int hd = 64, H = 16, KV = 2, window = 40;
    const std::vector<int> lens = {1, 17, 65, 300};
    const int R = int(lens.size()), ld = (H + 2 * KV) * hd, n_out = H * hd;
    const size_t row = size_t(KV) * hd, nr = lens.size();
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const std::vector<int32_t> ids = PagedRows::shuffled_blocks(lens, 2, rng);
    std::vector<__half> pool(ids.size() * B * row);
    for (auto& x : pool) x = __float2half(nd(rng));
    std::vector<float> qkv(nr * ld), inv_freq(size_t(hd / 2)), sinks(static_cast<size_t>(H));
    for (auto& x : qkv) x = nd(rng);
    for (int i = 0; i < hd / 2; ++i) inv_freq[size_t(i)] = float(std::pow(150000.0, -2.0 * i / hd)) * (i % 3 ? 1.0f : 0.25f);
    for (auto& x : sinks) x = nd(rng) + 1.0f;
    const PagedRows paged(lens, ids);
    const ehcuda::DeviceBuffer dpos = to_device(paged.pos), dstore = to_device(paged.store),
                               dtab = to_device(paged.table_at), dtables = to_device(paged.tables),
                               dfreq = to_device(inv_freq), dsinks = to_device(sinks);
    auto run = [&](bool fused, std::vector<float>& out, std::vector<__half>& k, std::vector<__half>& v) {
        ehcuda::DeviceBuffer dq = to_device(qkv), dk = to_device(pool), dv = to_device(pool);
        ehcuda::DeviceBuffer dout = to_device(std::vector<float>(nr * n_out, -7.0f));
        const int nsplit = 5;
        ehcuda::DeviceBuffer scratch(ehcuda::attention_decode_scratch_floats(R * H, hd, nsplit) * 4);
        ehcuda::DeviceBuffer counters = to_device(std::vector<uint32_t>(ehcuda::attention_decode_counters(H, R), 0u));
        if (fused) {
            // (freq_base stays the default: the table replaces it)
            ehcuda::DecodeAttnArgs a = decode_args(FusedCase{hd, H, KV, 0, window, true, hd}, nsplit, dq, dk, dv, dout,
                                                   scratch, counters);
            a.inv_freq = dfreq.as<float>();
            a.attn_factor = 1.3f;
            a.sinks = dsinks.as<float>();
            set_paged(a, R, ld, n_out, dpos, dstore, dtab, dtables);
            ASSERT_NO_THROW(ehcuda::rope_attention_decode(a, nullptr));
        } else {
            ehcuda::RopeTableArgs r;
            r.qkv = dq.as<float>();
            r.ld = ld;
            set_heads(r, H, KV, hd);
            r.n_rot = hd;
            r.neox = true;
            r.inv_freq = dfreq.as<float>();
            r.attn_factor = 1.3f;
            r.ntok = R;
            r.k_cache = dk.as<__half>();
            r.v_cache = dv.as<__half>();
            r.d_pos = dpos.as<int32_t>();
            r.d_rows = dstore.as<int32_t>();
            ASSERT_NO_THROW(ehcuda::rope_table_store_kv(r, nullptr));
            ehcuda::PagedAttnArgs at;
            at.q = dq.as<float>();
            at.ldq = ld;
            at.k_pool = dk.as<__half>();
            at.v_pool = dv.as<__half>();
            set_heads(at, H, KV, hd);
            at.ntok = R;
            set_tables(at, dpos, dtab, dtables);
            at.window = window;
            at.scale = 1 / std::sqrt(float(hd));
            at.sinks = dsinks.as<float>();
            at.out = dout.as<float>();
            at.ldo = n_out;
            ASSERT_NO_THROW(ehcuda::attention_paged(at, nullptr));
        }
        GPU_OK(cudaDeviceSynchronize());
        out = to_host<float>(dout, nr * n_out);
        k = to_host<__half>(dk, pool.size());
        v = to_host<__half>(dv, pool.size());
    };
    std::vector<float> fo, uo;
    std::vector<__half> fk, fv, uk, uv;
    run(true, fo, fk, fv);
    run(false, uo, uk, uv);
    EXPECT_TRUE(same_bits(fk, uk)) << "K pool differs from rope_table_store_kv's";
    EXPECT_TRUE(same_bits(fv, uv)) << "V pool differs";
    for (size_t i = 0; i < fo.size(); ++i)
        ASSERT_NEAR(fo[i], uo[i], 2e-4 * (1 + std::fabs(uo[i]))) << "output " << i << " (row " << i / size_t(n_out) << ")";
}

TEST(FusedDecode, PagedRejectsBadArguments) {
    REQUIRE_GPU();
    const FusedCase c{64, 4, 2, 10, 0, false, 64};
    Step s = zero_step(c, 4);
    auto a = s.args(c, 4);
    a.nrows = 2;  // several rows without the paged form
    EXPECT_THROW(ehcuda::rope_attention_decode(a, nullptr), ehp::Error);
    a = s.args(c, 4);
    a.paged = true;  // no positions, rows or tables
    EXPECT_THROW(ehcuda::rope_attention_decode(a, nullptr), ehp::Error);
}

TEST(FusedDecode, RowSplitsShrinkAsRowsFillTheGpu) {
    EXPECT_EQ(ehcuda::attention_decode_row_splits(4096, 14, 1), ehcuda::attention_decode_splits(4096));
    EXPECT_LT(ehcuda::attention_decode_row_splits(4096, 14, 8), ehcuda::attention_decode_splits(4096));
    EXPECT_EQ(ehcuda::attention_decode_row_splits(4096, 14, 64), 1);
    EXPECT_EQ(ehcuda::attention_decode_row_splits(64, 14, 1), 1);
}

TEST(FusedDecode, RejectsBadArguments) {
    REQUIRE_GPU();
    const FusedCase c{64, 4, 2, 10, 0, false, 64};
    Step s = zero_step(c, 4);
    auto a = s.args(c, 4);
    a.n_rot = 63;
    EXPECT_THROW(ehcuda::rope_attention_decode(a, nullptr), ehp::Error);
    a = s.args(c, 4);
    a.counters = nullptr;
    EXPECT_THROW(ehcuda::rope_attention_decode(a, nullptr), ehp::Error);
    a = s.args(c, 4);
    a.n_kv = 3;
    EXPECT_THROW(ehcuda::rope_attention_decode(a, nullptr), ehp::Error);
    // Chunk output: misaligned, under float GEMV input, or a head dim the
    // fallback (which writes no chunks) would take.
    ehcuda::DeviceBuffer chunks(4096);
    a = s.args(c, 4);
    a.out_chunks = static_cast<char*>(chunks.get()) + 8;
    EXPECT_THROW(ehcuda::rope_attention_decode(a, nullptr), ehp::Error);
    a.out_chunks = chunks.get();
    {
        InputGuard fl(ehcuda::GemvInput::Float);
        EXPECT_THROW(ehcuda::rope_attention_decode(a, nullptr), ehp::Error);
    }
    const FusedCase odd{32, 4, 2, 10, 0, false, 32};
    Step s32 = zero_step(odd, 4);
    a = s32.args(odd, 4);
    a.out_chunks = chunks.get();
    EXPECT_THROW(ehcuda::rope_attention_decode(a, nullptr), ehp::Error);
}

}  // namespace
}  // namespace ehtest
