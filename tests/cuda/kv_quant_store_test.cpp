// The quantized pool's K/V stores (kv_quant_store.cu) against the CPU
// reference's quantizer (quant_blocks.hpp's quantize_row): the same floats
// give the same bytes. V is stored as it comes, so a V row's codes and
// scales must equal quantize_row's bit for bit; K is rotated first, so with
// a rotary part of 2 dims only the 32-value blocks past the first are the
// input's (bit for bit), and the first block's values are checked against
// the rotation computed here. Both RoPE forms (the model's frequencies,
// llama-cuda; a frequency table, gpt-cuda), both types, and a head dim of
// 48, whose blocks span heads (one kernel block stores a token's KV heads).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <engine_host/quant_blocks.hpp>
#include <ehcuda/gpt_ops.hpp>
#include <ehcuda/kernels.hpp>
#include <ehcuda/kv_quant.hpp>
#include <ehcuda/kv_quant_store.hpp>

namespace {

bool have_gpu() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

constexpr int kHead = 4, kKv = 2, kTok = 3;

template <class T>
T* upload(const std::vector<T>& v) {
    T* d = nullptr;
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), v.size() * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}

struct Shape {
    int hd;
    int qkv() const { return (kHead + 2 * kKv) * hd; }
    int kv_dim() const { return kKv * hd; }
};

struct Stored {
    std::vector<float> qkv;               // the input rows
    std::vector<uint8_t> k, v;            // the pool rows written (row_bytes each, at rows[t])
    std::vector<int32_t> pos, rows;
    size_t row_bytes = 0;
};

// Runs one store of kTok tokens (positions 5, 17, 300 into pool rows 7, 2,
// 11) with `table` choosing the RoPE form.
Stored run_store(uint32_t type, bool table, Shape sh) {
    const int kHd = sh.hd, kQkv = sh.qkv(), kKvDim = sh.kv_dim();
    Stored s;
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 1.5f);
    s.qkv.resize(size_t(kTok) * kQkv);
    for (float& x : s.qkv) x = dist(rng);
    s.qkv[kHead * kHd + 40] = 0.0f;  // a block with a zero
    for (int e = 0; e < 32; ++e) s.qkv[(kHead + kKv) * kHd + 32 + e] = 0.0f;  // an all-zero V block: scale 0
    s.pos = {5, 17, 300};
    s.rows = {7, 2, 11};
    s.row_bytes = ehcuda::kv_row_bytes(type, kKvDim);
    const size_t pool = 16 * s.row_bytes;
    float* qkv = upload(s.qkv);
    int32_t* pos = upload(s.pos);
    int32_t* rows = upload(s.rows);
    std::vector<float> inv(1, 1.0f);
    float* inv_freq = upload(inv);
    void *kc = nullptr, *vc = nullptr;
    EXPECT_EQ(cudaMalloc(&kc, pool), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&vc, pool), cudaSuccess);
    cudaMemset(kc, 0xAB, pool);
    cudaMemset(vc, 0xAB, pool);
    if (table) {
        ehcuda::RopeTableArgs r;
        r.qkv = qkv;
        r.ld = kQkv;
        r.n_head = kHead;
        r.n_kv = kKv;
        r.head_dim = kHd;
        r.n_rot = 2;
        r.neox = true;
        r.inv_freq = inv_freq;
        r.attn_factor = 1.0f;
        r.ntok = kTok;
        r.k_cache = static_cast<__half*>(kc);
        r.v_cache = static_cast<__half*>(vc);
        r.d_pos = pos;
        r.d_rows = rows;
        ehcuda::rope_table_store_kv_quant(r, type, nullptr);
    } else {
        ehcuda::RopeArgs r;
        r.qkv = qkv;
        r.ld = kQkv;
        r.n_head = kHead;
        r.n_kv = kKv;
        r.head_dim = kHd;
        r.n_rot = 2;
        r.neox = true;
        r.freq_base = 1.0f;  // pair 0's frequency: base^0 = 1, as the table's
        r.ntok = kTok;
        r.k_cache = static_cast<__half*>(kc);
        r.v_cache = static_cast<__half*>(vc);
        r.d_pos = pos;
        r.d_rows = rows;
        r.kv_type = type;
        ehcuda::rope_store_kv(r, nullptr);
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    s.k.resize(pool);
    s.v.resize(pool);
    cudaMemcpy(s.k.data(), kc, pool, cudaMemcpyDeviceToHost);
    cudaMemcpy(s.v.data(), vc, pool, cudaMemcpyDeviceToHost);
    for (void* p : {static_cast<void*>(qkv), static_cast<void*>(pos), static_cast<void*>(rows),
                    static_cast<void*>(inv_freq), kc, vc})
        cudaFree(p);
    return s;
}

// quantize_row's blocks of kv_dim values split into the pool's layout:
// codes, then scales.
void reference_row(uint32_t type, const float* x, int kKvDim, std::vector<uint8_t>& codes,
                   std::vector<uint8_t>& scales) {
    std::vector<uint8_t> blocks(ehp::quant::row_bytes(type, kKvDim));
    ASSERT_TRUE(ehp::quant::quantize_row(type, x, blocks.data(), kKvDim));
    codes.assign(kKvDim, 0);
    scales.assign(kKvDim / 32 * 2, 0);
    for (int b = 0; b < kKvDim / 32; ++b) {
        std::memcpy(&scales[2 * b], &blocks[34 * b], 2);  // block_q8_0 / block_fp8_e4m3: d, then 32 codes
        std::memcpy(&codes[32 * b], &blocks[34 * b + 2], 32);
    }
}

float stored_value(uint32_t type, const uint8_t* row, int kKvDim, int e) {
    uint16_t d;
    std::memcpy(&d, row + kKvDim + 2 * (e / 32), 2);
    const float code = type == EH_TYPE_Q8_0 ? float(int8_t(row[e])) : ehp::quant::e4m3_to_fp32(row[e]);
    return code * ehp::quant::fp16_to_fp32(d);
}

struct StoreCase {
    uint32_t type;
    bool table;
    int hd = 128;
};
class KvQuantStore : public ::testing::TestWithParam<StoreCase> {};

TEST_P(KvQuantStore, BytesAreTheCpuQuantizers) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    const StoreCase c = GetParam();
    const Shape sh{c.hd};
    const int kHd = sh.hd, kQkv = sh.qkv(), kKvDim = sh.kv_dim();
    const Stored s = run_store(c.type, c.table, sh);
    ASSERT_EQ(s.row_bytes % 16, 0u);
    for (int t = 0; t < kTok; ++t) {
        const float* q = &s.qkv[size_t(t) * kQkv];
        const uint8_t* krow = &s.k[size_t(s.rows[t]) * s.row_bytes];
        const uint8_t* vrow = &s.v[size_t(s.rows[t]) * s.row_bytes];
        std::vector<uint8_t> codes, scales;
        // V: the input as it is
        reference_row(c.type, q + (kHead + kKv) * kHd, kKvDim, codes, scales);
        EXPECT_EQ(0, std::memcmp(vrow, codes.data(), kKvDim)) << "V codes, token " << t;
        EXPECT_EQ(0, std::memcmp(vrow + kKvDim, scales.data(), scales.size())) << "V scales, token " << t;
        // K: each head's dims 0 and 1 rotated by pos radians (NEOX pairs i,
        // i + n_rot / 2 = 0, 1), the rest the input
        std::vector<float> k(q + kHead * kHd, q + kHead * kHd + kKvDim);
        for (int h = 0; h < kKv; ++h) {
            const double a = s.pos[t];
            const double x0 = k[h * kHd], x1 = k[h * kHd + 1];
            k[h * kHd] = float(x0 * std::cos(a) - x1 * std::sin(a));
            k[h * kHd + 1] = float(x1 * std::cos(a) + x0 * std::sin(a));
        }
        reference_row(c.type, k.data(), kKvDim, codes, scales);
        for (int b = 0; b < kKvDim / 32; ++b) {
            bool rotated = false;  // the block holds a head's dim 0 or 1
            for (int h = 0; h < kKv; ++h) rotated = rotated || (h * kHd + 1 >= 32 * b && h * kHd < 32 * b + 32);
            if (rotated) {
                // the rotated block: its values as close as the format allows
                for (int e = 32 * b; e < 32 * b + 32; ++e) {
                    float amax = 0.0f;
                    for (int j = 32 * b; j < 32 * b + 32; ++j) amax = std::max(amax, std::fabs(k[j]));
                    const float step = c.type == EH_TYPE_Q8_0 ? amax / 127.0f : std::max(std::fabs(k[e]) / 8.0f, amax / 448.0f / 64.0f);
                    EXPECT_NEAR(stored_value(c.type, krow, kKvDim, e), k[e], step * 0.51f + 1e-6f)
                        << "K " << e << ", token " << t;
                }
                continue;
            }
            EXPECT_EQ(0, std::memcmp(krow + 32 * b, &codes[32 * b], 32)) << "K block " << b << ", token " << t;
            EXPECT_EQ(0, std::memcmp(krow + kKvDim + 2 * b, &scales[2 * b], 2)) << "K scale " << b << ", token " << t;
        }
    }
    // rows no token was stored to keep their bytes
    EXPECT_EQ(s.k[0], 0xAB);
    EXPECT_EQ(s.v[3 * s.row_bytes + 5], 0xAB);
}

INSTANTIATE_TEST_SUITE_P(Types, KvQuantStore,
                         ::testing::Values(StoreCase{EH_TYPE_Q8_0, false}, StoreCase{EH_TYPE_FP8_E4M3, false},
                                           StoreCase{EH_TYPE_Q8_0, true}, StoreCase{EH_TYPE_FP8_E4M3, true},
                                           StoreCase{EH_TYPE_Q8_0, false, 48}, StoreCase{EH_TYPE_FP8_E4M3, true, 48}),
                         [](const auto& i) {
                             return std::string(i.param.type == EH_TYPE_Q8_0 ? "Q8_0" : "FP8_E4M3") +
                                    (i.param.table ? "_table" : "_freq") + "_hd" + std::to_string(i.param.hd);
                         });

}  // namespace
