// LayerNorm, GELU, learned positions, table RoPE and sink attention (see
// gpt_ops.hpp).
#include <cmath>

#include "block_reduce.cuh"
#include "ehcuda/check.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/gpt_ops.hpp"
#include "ehcuda/quant.cuh"

namespace ehcuda {
namespace {

constexpr int kNormThreads = 256;

// Two passes over the row (mean, then centred variance) as the reference
// does; the row is tiny next to the weights, so the second read is free.
__global__ void layernorm_kernel(const float* x, int ldx, const float* w, const float* b, float* out,
                                 int ldo, int n, float eps) {
    pdl_entry();
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
    float* r = x + size_t(blockIdx.y) * ld;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        const float v = r[i];
        const float c = 0.7978845608028654f;  // sqrt(2/pi)
        r[i] = 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
    }
}

__global__ void add_rows_kernel(const uint8_t* table, size_t row_bytes, int type, int cols,
                                const int32_t* d_pos0, float* h) {
    pdl_entry();
    const int t = blockIdx.x;
    const uint8_t* row = table + size_t(*d_pos0 + t) * row_bytes;
    float* o = h + size_t(t) * cols;
    for (int c = threadIdx.x; c < cols / 32; c += blockDim.x) {
        float v[32];
        dispatch_type(type, [&]<int T>() { load_chunk<T>(row, c, v); });
#pragma unroll
        for (int j = 0; j < 32; ++j) o[32 * c + j] += v[j];
    }
}

__device__ __forceinline__ void store_kv(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store_kv(float* p, float v) { *p = v; }
__device__ __forceinline__ float load_kv(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float load_kv(const float* p) { return *p; }

template <class C>
__global__ void rope_table_kernel(RopeTableArgs a, C* k_cache, C* v_cache) {
    pdl_entry();
    const int t = blockIdx.x;
    const int pos = *a.d_pos0 + t;
    float* row = a.qkv + size_t(t) * a.ld;
    const int hd = a.head_dim, half_rot = a.n_rot / 2;
    const int nq = a.n_head * hd, nk = a.n_kv * hd;
    C* kc = k_cache + size_t(pos) * nk;
    C* vc = v_cache + size_t(pos) * nk;
    if (half_rot > 0) {
        const int pairs = (a.n_head + a.n_kv) * half_rot;
        for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
            const int head = p / half_rot, i = p % half_rot;
            float sn, cs;
            sincosf(float(pos) * a.inv_freq[i], &sn, &cs);
            cs *= a.attn_factor;
            sn *= a.attn_factor;
            const int i0 = a.neox ? i : 2 * i;
            const int i1 = a.neox ? i + half_rot : 2 * i + 1;
            float* base = head < a.n_head ? row + head * hd : row + nq + (head - a.n_head) * hd;
            const float x0 = base[i0], x1 = base[i1];
            const float y0 = x0 * cs - x1 * sn, y1 = x1 * cs + x0 * sn;
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
    for (int e = threadIdx.x; e < nk; e += blockDim.x) {
        if ((e % hd) >= a.n_rot) store_kv(kc + e, krow[e]);
        store_kv(vc + e, vrow[e]);
    }
}

constexpr int kAttnWarps = 8;
constexpr int kKeyGroup = 4;  // keys a warp scores together (independent loads in flight)
constexpr int kMaxDpl = 8;    // head_dim <= 256

// One block per (query token, head). Warp w takes groups of kKeyGroup
// consecutive keys, kAttnWarps groups apart; lane i holds dims i, i+32, ...
// of the query and of its running output.
template <int DPL, class C>
__global__ void __launch_bounds__(kAttnWarps * 32) sink_attn_kernel(SinkAttnArgs a, const C* k_cache,
                                                                    const C* v_cache) {
    pdl_entry();
    __shared__ float sm_m[kAttnWarps], sm_l[kAttnWarps];
    __shared__ float sm_acc[kAttnWarps][DPL * 32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int t = blockIdx.x, head = blockIdx.y;
    const int hd = a.head_dim;
    const int kvh = head / (a.n_head / a.n_kv);
    const int qpos = *a.d_pos0 + t;
    const int kstart = a.window > 0 ? max(0, qpos - a.window + 1) : 0;
    const int kv_ld = a.n_kv * hd;

    float q[DPL];
    const float* qr = a.q + size_t(t) * a.ldq + size_t(head) * hd;
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
        const int d = lane + 32 * i;
        q[i] = d < hd ? qr[d] * a.scale : 0.0f;
    }
    float m = -INFINITY, l = 0.0f, acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] = 0.0f;
    for (int kb = kstart + warp * kKeyGroup; kb <= qpos; kb += kAttnWarps * kKeyGroup) {
        float s[kKeyGroup], vv[kKeyGroup][DPL];
#pragma unroll
        for (int g = 0; g < kKeyGroup; ++g) {
            const int key = kb + g;
            const bool valid = key <= qpos;
            const C* kr = k_cache + size_t(key) * kv_ld + size_t(kvh) * hd;
            const C* vr = v_cache + size_t(key) * kv_ld + size_t(kvh) * hd;
            float part = 0.0f;
#pragma unroll
            for (int i = 0; i < DPL; ++i) {
                const int d = lane + 32 * i;
                const bool in = valid && d < hd;
                part = fmaf(q[i], in ? load_kv(kr + d) : 0.0f, part);
                vv[g][i] = in ? load_kv(vr + d) : 0.0f;
            }
            s[g] = part;
        }
        float gmax = -INFINITY;
#pragma unroll
        for (int g = 0; g < kKeyGroup; ++g) {
            s[g] = kb + g <= qpos ? detail::warp_sum(s[g]) : -INFINITY;
            gmax = fmaxf(gmax, s[g]);
        }
        const float mnew = fmaxf(m, gmax);
        const float alpha = m == -INFINITY ? 0.0f : __expf(m - mnew);
        l *= alpha;
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[i] *= alpha;
#pragma unroll
        for (int g = 0; g < kKeyGroup; ++g) {
            const float p = s[g] == -INFINITY ? 0.0f : __expf(s[g] - mnew);
            l += p;
#pragma unroll
            for (int i = 0; i < DPL; ++i) acc[i] = fmaf(p, vv[g][i], acc[i]);
        }
        m = mnew;
    }
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < DPL; ++i) sm_acc[warp][lane + 32 * i] = acc[i];
    __syncthreads();

    const float sink = a.sinks ? a.sinks[head] : -INFINITY;
    float M = sink;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, sm_m[w]);
    float L = a.sinks ? __expf(sink - M) : 0.0f;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w)
        if (sm_m[w] != -INFINITY) L += sm_l[w] * __expf(sm_m[w] - M);
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    float* o = a.out + size_t(t) * a.ldo + size_t(head) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float A = 0.0f;
#pragma unroll
        for (int w = 0; w < kAttnWarps; ++w)
            if (sm_m[w] != -INFINITY) A += sm_acc[w][d] * __expf(sm_m[w] - M);
        o[d] = A * inv;
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

void add_position_rows(const WeightRef& table, const int32_t* d_pos0, int ntok, float* h,
                       cudaStream_t stream) {
    if (ntok <= 0) return;
    if (!matmul_type_supported(table.type) || table.cols % 32)
        throw ehp::Error(EH_UNSUPPORTED, "position table: unsupported type or width");
    launch("add_rows_kernel", add_rows_kernel, ntok, 128, 0, stream, static_cast<const uint8_t*>(table.data), table.row_bytes,
                                              int(table.type), table.cols, d_pos0, h);
    EHC_LAUNCHED("add_rows_kernel");
}

void rope_table_store_kv(const RopeTableArgs& a, cudaStream_t stream) {
    if (a.ntok <= 0) return;
    if (a.n_rot < 0 || a.n_rot > a.head_dim || a.n_rot % 2 || (a.n_rot > 0 && !a.inv_freq))
        throw ehp::Error(EH_INTERNAL, "rope: bad rotary dimension or missing frequency table");
    if (a.k_cache32 && a.v_cache32) launch("rope_table_kernel", rope_table_kernel<float>, a.ntok, 256, 0, stream, a, a.k_cache32, a.v_cache32);
    else launch("rope_table_kernel", rope_table_kernel<__half>, a.ntok, 256, 0, stream, a, a.k_cache, a.v_cache);
    EHC_LAUNCHED("rope_table_kernel");
}

void attention_sinks(const SinkAttnArgs& a, cudaStream_t stream) {
    if (a.ntok <= 0) return;
    if (a.head_dim <= 0 || a.head_dim > 32 * kMaxDpl)
        throw ehp::Error(EH_UNSUPPORTED, "attention: head_dim " + std::to_string(a.head_dim) + " unsupported (1..256)");
    if (a.n_kv <= 0 || a.n_head % a.n_kv) throw ehp::Error(EH_INTERNAL, "attention: n_head must be a multiple of n_kv");
    const dim3 grid(a.ntok, a.n_head);
    const int dpl = (a.head_dim + 31) / 32;
    auto go = [&](auto kc, auto vc) {
        using C = std::remove_const_t<std::remove_pointer_t<decltype(kc)>>;
        if (dpl == 1) launch("sink_attn_kernel", sink_attn_kernel<1, C>, grid, kAttnWarps * 32, 0, stream, a, kc, vc);
        else if (dpl == 2) launch("sink_attn_kernel", sink_attn_kernel<2, C>, grid, kAttnWarps * 32, 0, stream, a, kc, vc);
        else if (dpl <= 4) launch("sink_attn_kernel", sink_attn_kernel<4, C>, grid, kAttnWarps * 32, 0, stream, a, kc, vc);
        else launch("sink_attn_kernel", sink_attn_kernel<8, C>, grid, kAttnWarps * 32, 0, stream, a, kc, vc);
    };
    if (a.k_cache32 && a.v_cache32) go(a.k_cache32, a.v_cache32);
    else go(a.k_cache, a.v_cache);
    EHC_LAUNCHED("sink_attn_kernel");
}

}  // namespace ehcuda
