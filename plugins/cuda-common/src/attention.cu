// GQA attention over the FP16 KV cache.
//
// Prefill: a block serves 8 consecutive queries of one head (one warp each).
// K/V tiles of 32 positions are staged in shared memory once for all eight;
// each warp scores the tile (lane = key), then folds it into its running
// output with the online-softmax rescaling (flash-attention style), so the
// score matrix never exists in memory.
//
// Decode: the KV range is split into chunks (split-K); each block reduces its
// chunk to (max, sum, weighted V) and a second kernel merges the chunks in
// split order. Nothing is accumulated with atomics, so results are bitwise
// reproducible.
//
// Other head dims go to attention_generic (attention_generic.cu).
#include <cmath>

#include "block_reduce.cuh"
#include "ehcuda/check.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/kernels.hpp"

namespace ehcuda {
namespace {

constexpr int kQPerBlock = 8;
constexpr int kKeyTile = 32;

template <int DPL>
__global__ void __launch_bounds__(kQPerBlock * 32) attn_prefill_kernel(AttnArgs a) {
    pdl_entry();
    constexpr int HD = DPL * 32;
    constexpr int KLD = HD + 2;  // padded row: lanes hit distinct banks
    __shared__ __align__(16) __half Ks[kKeyTile * KLD];
    __shared__ __align__(16) __half Vs[kKeyTile * HD];
    __shared__ float Qs[kQPerBlock][HD];

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int head = blockIdx.y;
    const int kvh = head / (a.n_head / a.n_kv);
    const int t = blockIdx.x * kQPerBlock + warp;
    const bool active = t < a.ntok;
    const int pos0 = *a.d_pos0;
    const int qpos = pos0 + t;
    const int kv_ld = a.n_kv * HD;

    if (active) {
        const float* q = a.q + size_t(t) * a.ldq + head * HD;
#pragma unroll
        for (int i = 0; i < DPL; ++i) Qs[warp][lane + 32 * i] = q[lane + 32 * i] * a.scale;
    }
    const int t_first = blockIdx.x * kQPerBlock;
    const int t_last = min(t_first + kQPerBlock, a.ntok) - 1;
    const int kend = pos0 + t_last + 1;
    const int kstart = a.window > 0 ? max(0, pos0 + t_first - a.window + 1) : 0;

    float m = -INFINITY, l = 0.0f, acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] = 0.0f;

    for (int kb = kstart; kb < kend; kb += kKeyTile) {
        __syncthreads();
        for (int e = threadIdx.x; e < kKeyTile * (HD / 2); e += blockDim.x) {
            const int key = e / (HD / 2), d2 = e % (HD / 2);
            const int pos = kb + key;
            __half2 kv = __float2half2_rn(0.0f), vv = kv;
            if (pos < kend) {
                size_t off = size_t(pos) * kv_ld + kvh * HD + 2 * d2;
                kv = *reinterpret_cast<const __half2*>(a.k_cache + off);
                vv = *reinterpret_cast<const __half2*>(a.v_cache + off);
            }
            *reinterpret_cast<__half2*>(Ks + key * KLD + 2 * d2) = kv;
            *reinterpret_cast<__half2*>(Vs + key * HD + 2 * d2) = vv;
        }
        __syncthreads();
        if (!active) continue;

        const int key = kb + lane;
        const bool valid = key <= qpos && (a.window <= 0 || key > qpos - a.window);
        float s = -INFINITY;
        if (valid) {
            float dot = 0.0f;
            const __half2* kr = reinterpret_cast<const __half2*>(Ks + lane * KLD);
#pragma unroll 8
            for (int d2 = 0; d2 < HD / 2; ++d2) {
                float2 kf = __half22float2(kr[d2]);
                dot = fmaf(Qs[warp][2 * d2], kf.x, dot);
                dot = fmaf(Qs[warp][2 * d2 + 1], kf.y, dot);
            }
            s = dot;
        }
        const float mt = detail::warp_max(s);
        if (mt == -INFINITY) continue;
        const float mnew = fmaxf(m, mt);
        const float alpha = (m == -INFINITY) ? 0.0f : __expf(m - mnew);
        const float p = valid ? __expf(s - mnew) : 0.0f;
        l = l * alpha + detail::warp_sum(p);
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[i] *= alpha;
        for (int j = 0; j < kKeyTile; ++j) {
            const float pj = __shfl_sync(0xffffffffu, p, j);
            if (pj == 0.0f) continue;
#pragma unroll
            for (int i = 0; i < DPL; ++i) acc[i] = fmaf(pj, __half2float(Vs[j * HD + lane + 32 * i]), acc[i]);
        }
        m = mnew;
    }
    if (active) {
        float* o = a.out + size_t(t) * a.ldo + head * HD;
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) o[lane + 32 * i] = acc[i] * inv;
    }
}

constexpr int kDecodeWarps = 4;
constexpr int kMinChunk = 64;
// Keys a warp scores per iteration. The loop is latency-bound (each key is a
// dependent load → reduce → rescale chain), so loading several keys' K and V
// rows before reducing any of them keeps that many loads in flight.
constexpr int kKeysPerIter = 4;

// scratch layout per (head, split): [m, l, acc[HD]]
template <int DPL>
__global__ void __launch_bounds__(kDecodeWarps * 32) attn_decode_kernel(AttnArgs a, float* scratch) {
    pdl_entry();
    constexpr int HD = DPL * 32;
    __shared__ float sm_m[kDecodeWarps], sm_l[kDecodeWarps];
    __shared__ float sm_acc[kDecodeWarps][HD];

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int head = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y;
    const int kvh = head / (a.n_head / a.n_kv);
    const int qpos = *a.d_pos0;
    const int len = qpos + 1;
    const int kstart = a.window > 0 ? max(0, qpos - a.window + 1) : 0;
    const int range = len - kstart;
    const int chunk = max(kMinChunk, (range + nsplit - 1) / nsplit);
    const int ks = kstart + split * chunk;
    const int ke = min(len, ks + chunk);
    const int kv_ld = a.n_kv * HD;

    float q[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) q[i] = a.q[head * HD + lane + 32 * i] * a.scale;

    float m = -INFINITY, l = 0.0f, acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] = 0.0f;
    // Warp w takes keys ks + w*G .. +G-1, then jumps by kDecodeWarps*G.
    for (int kb = ks + warp * kKeysPerIter; kb < ke; kb += kDecodeWarps * kKeysPerIter) {
        float kf[kKeysPerIter][DPL], vf[kKeysPerIter][DPL];
#pragma unroll
        for (int j = 0; j < kKeysPerIter; ++j) {
            const int key = min(kb + j, ke - 1);  // clamped: a valid row, masked below
            const __half* kr = a.k_cache + size_t(key) * kv_ld + kvh * HD;
            const __half* vr = a.v_cache + size_t(key) * kv_ld + kvh * HD;
#pragma unroll
            for (int i = 0; i < DPL; ++i) {
                kf[j][i] = __half2float(kr[lane + 32 * i]);
                vf[j][i] = __half2float(vr[lane + 32 * i]);
            }
        }
        float s[kKeysPerIter];
#pragma unroll
        for (int j = 0; j < kKeysPerIter; ++j) {
            float d = 0.0f;
#pragma unroll
            for (int i = 0; i < DPL; ++i) d = fmaf(q[i], kf[j][i], d);
            s[j] = d;
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
#pragma unroll
            for (int j = 0; j < kKeysPerIter; ++j) s[j] += __shfl_xor_sync(0xffffffffu, s[j], off);
        float mt = m;
#pragma unroll
        for (int j = 0; j < kKeysPerIter; ++j)
            if (kb + j < ke) mt = fmaxf(mt, s[j]);
        const float alpha = (m == -INFINITY) ? 0.0f : __expf(m - mt);
        l *= alpha;
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[i] *= alpha;
#pragma unroll
        for (int j = 0; j < kKeysPerIter; ++j) {
            const float p = (kb + j < ke) ? __expf(s[j] - mt) : 0.0f;
            l += p;
#pragma unroll
            for (int i = 0; i < DPL; ++i) acc[i] = fmaf(p, vf[j][i], acc[i]);
        }
        m = mt;
    }
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < DPL; ++i) sm_acc[warp][lane + 32 * i] = acc[i];
    __syncthreads();

    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) M = fmaxf(M, sm_m[w]);
    float* out = scratch + size_t(head * nsplit + split) * (HD + 2);
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float A = 0.0f;
#pragma unroll
        for (int w = 0; w < kDecodeWarps; ++w)
            if (sm_m[w] != -INFINITY) A += sm_acc[w][d] * __expf(sm_m[w] - M);
        out[2 + d] = A;
    }
    if (threadIdx.x == 0) {
        float L = 0.0f;
        for (int w = 0; w < kDecodeWarps; ++w)
            if (sm_m[w] != -INFINITY) L += sm_l[w] * __expf(sm_m[w] - M);
        out[0] = M;
        out[1] = L;
    }
}

__global__ void attn_merge_kernel(const float* scratch, int nsplit, int hd, float* out) {
    pdl_entry();
    const int head = blockIdx.x;
    const float* base = scratch + size_t(head) * nsplit * (hd + 2);
    float M = -INFINITY;
    for (int s = 0; s < nsplit; ++s) M = fmaxf(M, base[size_t(s) * (hd + 2)]);
    float L = 0.0f;
    for (int s = 0; s < nsplit; ++s) {
        const float ms = base[size_t(s) * (hd + 2)];
        if (ms != -INFINITY) L += base[size_t(s) * (hd + 2) + 1] * __expf(ms - M);
    }
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float A = 0.0f;
        for (int s = 0; s < nsplit; ++s) {
            const float ms = base[size_t(s) * (hd + 2)];
            if (ms != -INFINITY) A += base[size_t(s) * (hd + 2) + 2 + d] * __expf(ms - M);
        }
        out[head * hd + d] = A * inv;
    }
}

void validate(const AttnArgs& a) {
    if (!attention_head_dim_supported(a.head_dim))
        throw ehp::Error(EH_UNSUPPORTED, "attention: head_dim " + std::to_string(a.head_dim) + " unsupported (max " +
                                             std::to_string(kAttentionMaxHeadDim) + ")");
    if (a.n_kv <= 0 || a.n_head % a.n_kv)
        throw ehp::Error(EH_INTERNAL, "attention: n_head must be a multiple of n_kv");
}

template <class F>
void by_dpl(int head_dim, F&& f) {
    switch (head_dim / 32) {
    case 2: f.template operator()<2>(); break;
    case 3: f.template operator()<3>(); break;
    case 4: f.template operator()<4>(); break;
    case 8: f.template operator()<8>(); break;
    default: throw ehp::Error(EH_UNSUPPORTED, "attention: head_dim unsupported");
    }
}

}  // namespace

bool attention_head_dim_supported(int hd) { return hd >= 1 && hd <= kAttentionMaxHeadDim; }
bool attention_head_dim_fast(int hd) { return hd == 64 || hd == 96 || hd == 128 || hd == 256; }

void attention_prefill(const AttnArgs& a, cudaStream_t stream) {
    validate(a);
    if (a.ntok <= 0) return;
    if (!attention_head_dim_fast(a.head_dim)) return attention_generic(a, stream);
    dim3 grid((a.ntok + kQPerBlock - 1) / kQPerBlock, a.n_head);
    by_dpl(a.head_dim, [&]<int DPL>() {
        launch("attn_prefill_kernel", attn_prefill_kernel<DPL>, grid, kQPerBlock * 32, 0, stream, a);
    });
    EHC_LAUNCHED("attn_prefill_kernel");
}

int attention_decode_splits(uint32_t n_ctx) {
    // Enough splits that a full cache gives each block about kMinChunk keys
    // (the grid is fixed when the decode step is captured, so size it for
    // the longest sequence; splits past the current length exit at once).
    const uint32_t n = (n_ctx + kMinChunk - 1) / kMinChunk;
    return int(n < 1 ? 1 : n > 128 ? 128 : n);
}

size_t attention_decode_scratch_floats(int n_head, int head_dim, int nsplit) {
    return size_t(n_head) * nsplit * (head_dim + 2);
}

void attention_decode(const AttnArgs& a, float* scratch, int nsplit, cudaStream_t stream) {
    validate(a);
    if (a.ntok != 1) throw ehp::Error(EH_INTERNAL, "attention_decode: one token only");
    if (!attention_head_dim_fast(a.head_dim)) return attention_generic(a, stream);
    if (nsplit < 1) nsplit = 1;
    by_dpl(a.head_dim, [&]<int DPL>() {
        launch("attn_decode_kernel", attn_decode_kernel<DPL>, dim3(a.n_head, nsplit), kDecodeWarps * 32, 0, stream, a, scratch);
    });
    EHC_LAUNCHED("attn_decode_kernel");
    launch("attn_merge_kernel", attn_merge_kernel, a.n_head, 128, 0, stream, scratch, nsplit, a.head_dim, a.out);
    EHC_LAUNCHED("attn_merge_kernel");
}

}  // namespace ehcuda
