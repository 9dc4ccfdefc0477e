// LayerNorm, GELU, learned positions and table RoPE (see gpt_ops.hpp); the
// sink attention is in attention_decode_sinks.cu.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "block_reduce.cuh"
#include "gemv_stage.cuh"
#include "ehcuda/attention_prefill.hpp"
#include "ehcuda/check.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/gpt_ops.hpp"
#include "ehcuda/quant.cuh"
#include "rope_table.cuh"

namespace ehcuda {
namespace {

using detail::rope_table_pair;
using detail::store_kv;

constexpr int kNormThreads = 256;

// Two passes over the row (mean, then centred variance) as the reference
// does; the row is tiny next to the weights, so the second read is free.
__global__ void layernorm_kernel(const float* x, int ldx, const float* w, const float* b, float* out,
                                 int ldo, int n, float eps) {
    pdl_entry();
    pdl_release();
    __shared__ float shm[32];
    const float* xr = x + size_t(blockIdx.x) * ldx;
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += xr[i];
    const float mean = detail::block_sum(s, shm) / float(n);
    float v = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float d = xr[i] - mean;
        v = fmaf(d, d, v);
    }
    const float inv = rsqrtf(detail::block_sum(v, shm) / float(n) + eps);
    float* o = out + size_t(blockIdx.x) * ldo;
    for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = (xr[i] - mean) * inv * w[i] + (b ? b[i] : 0.0f);
}

__global__ void gelu_kernel(float* x, int ld, int n) {
    pdl_entry();
    pdl_release();
    float* r = x + size_t(blockIdx.y) * ld;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        const float v = r[i];
        const float c = 0.7978845608028654f;  // sqrt(2/pi)
        r[i] = 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
    }
}

// Token t takes row d_pos[t].
__global__ void add_rows_kernel(const uint8_t* table, size_t row_bytes, int type, int cols, const int32_t* d_pos,
                                float* h) {
    pdl_entry();
    pdl_release();
    const int t = blockIdx.x;
    const uint8_t* row = table + size_t(d_pos[t]) * row_bytes;
    float* o = h + size_t(t) * cols;
    for (int c = threadIdx.x; c < cols / 32; c += blockDim.x) {
        float v[32];
        dispatch_type(type, [&]<int T>() { load_chunk<T>(row, c, v); });
#pragma unroll
        for (int j = 0; j < 32; ++j) o[32 * c + j] += v[j];
    }
}


template <class C>
__global__ void rope_table_kernel(RopeTableArgs a, C* k_cache, C* v_cache) {
    pdl_entry();
    pdl_release();
    // Block row blockIdx.x per token; a single token's pairs are spread over
    // gridDim.y blocks (one block took ~9 us per gpt-oss layer at decode).
    const int t = blockIdx.x;
    const int tid = blockIdx.y * blockDim.x + threadIdx.x, nthr = gridDim.y * blockDim.x;
    const int pos = a.d_pos ? a.d_pos[t] : *a.d_pos0 + t;
    const size_t cache_row = a.d_rows ? size_t(a.d_rows[t]) : size_t(pos);
    float* row = a.qkv + size_t(t) * a.ld;
    const int hd = a.head_dim, half_rot = a.n_rot / 2;
    const int nq = a.n_head * hd, nk = a.n_kv * hd;
    C* kc = k_cache + cache_row * nk;
    C* vc = v_cache + cache_row * nk;
    if (half_rot > 0) {
        const int pairs = (a.n_head + a.n_kv) * half_rot;
        for (int p = tid; p < pairs; p += nthr) {
            const int head = p / half_rot, i = p % half_rot;
            const int i0 = a.neox ? i : 2 * i;
            const int i1 = a.neox ? i + half_rot : 2 * i + 1;
            float* base = head < a.n_head ? row + head * hd : row + nq + (head - a.n_head) * hd;
            float y0 = base[i0], y1 = base[i1];
            rope_table_pair(a, pos, i, y0, y1);
            if (head < a.n_head) {
                base[i0] = y0;
                base[i1] = y1;
            } else {
                C* kd = kc + (head - a.n_head) * hd;
                store_kv(kd + i0, y0);
                store_kv(kd + i1, y1);
            }
        }
    }
    const float* krow = row + nq;
    const float* vrow = row + nq + nk;
    for (int e = tid; e < nk; e += nthr) {
        if ((e % hd) >= a.n_rot) store_kv(kc + e, krow[e]);
        store_kv(vc + e, vrow[e]);
    }
}

}  // namespace

void layernorm(const float* x, int ldx, const float* w, const float* b, float* out, int ldo, int n,
               int ntok, float eps, cudaStream_t stream) {
    if (ntok <= 0) return;
    launch("layernorm_kernel", layernorm_kernel, ntok, kNormThreads, 0, stream, x, ldx, w, b, out, ldo, n, eps);
    EHC_LAUNCHED("layernorm_kernel");
}

void gelu_tanh_inplace(float* x, int ld, int n, int ntok, cudaStream_t stream) {
    if (ntok <= 0 || n <= 0) return;
    const int threads = 256;
    const int bx = (n + threads - 1) / threads;
    launch("gelu_kernel", gelu_kernel, dim3(bx, ntok), threads, 0, stream, x, ld, n);
    EHC_LAUNCHED("gelu_kernel");
}

void add_position_rows_at(const WeightRef& table, const int32_t* d_pos, int ntok, float* h, cudaStream_t stream) {
    if (ntok <= 0) return;
    if (!matmul_type_supported(table.type) || table.cols % 32)
        throw ehp::Error(EH_UNSUPPORTED, "position table: unsupported type or width");
    launch("add_rows_kernel", add_rows_kernel, ntok, 128, 0, stream, static_cast<const uint8_t*>(table.data),
           table.row_bytes, int(table.type), table.cols, d_pos, h);
    EHC_LAUNCHED("add_rows_kernel");
}

void rope_table_store_kv(const RopeTableArgs& a, cudaStream_t stream) {
    if (a.ntok <= 0) return;
    if (a.n_rot < 0 || a.n_rot > a.head_dim || a.n_rot % 2 || (a.n_rot > 0 && !a.inv_freq))
        throw ehp::Error(EH_INTERNAL, "rope: bad rotary dimension or missing frequency table");
    if (!a.d_pos != !a.d_rows) throw ehp::Error(EH_INTERNAL, "rope: d_pos and d_rows come together");
    if (a.q_norm || a.k_norm)
        throw ehp::Error(EH_INTERNAL, "rope: QK-norm weights are rope_sink_attention_decode's only (head_rmsnorm first)");
    const int work = std::max((a.n_head + a.n_kv) * (a.n_rot / 2), a.n_kv * a.head_dim);
    const dim3 grid(unsigned(a.ntok), a.ntok == 1 ? unsigned(std::clamp((work + 255) / 256, 1, 64)) : 1u);
    if (a.k_cache32 && a.v_cache32) launch("rope_table_kernel", rope_table_kernel<float>, grid, 256, 0, stream, a, a.k_cache32, a.v_cache32);
    else launch("rope_table_kernel", rope_table_kernel<__half>, grid, 256, 0, stream, a, a.k_cache, a.v_cache);
    EHC_LAUNCHED("rope_table_kernel");
}

}  // namespace ehcuda
