// Norms, embedding lookup and RoPE (with the KV-cache store fused in).
#include <algorithm>
#include <cmath>

#include "block_reduce.cuh"
#include "ehcuda/check.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/kernels.hpp"
#include "ehcuda/quant.cuh"
#include "head_norm.cuh"
#include "rope.cuh"

namespace ehcuda {
namespace {

constexpr int kNormThreads = 256;

// Rows of at most kNormThreads * kNormHeld values (most models' widths)
// stay in registers between the residual add, the sum of squares and the
// output: one read of h and delta instead of three passes over memory. The
// same thread sums the same elements in the same order either way, so the
// bits do not depend on the form.
constexpr int kNormHeld = 16;

__global__ void rmsnorm_kernel(const float* x, int ldx, float* h, const float* delta,
                               const float* w, float* out, int ldo, int n, float eps) {
    pdl_entry();
    pdl_release();
    __shared__ float shm[32];
    const int t = blockIdx.x;
    float* o = out + size_t(t) * (h ? n : ldo);
    if (n <= kNormThreads * kNormHeld) {
        float v[kNormHeld];
        float ss = 0.0f;
        const float* xr = h ? h + size_t(t) * n : x + size_t(t) * ldx;
        const float* dr = h ? delta + size_t(t) * n : nullptr;
#pragma unroll
        for (int j = 0; j < kNormHeld; ++j) {
            const int i = threadIdx.x + j * kNormThreads;
            if (i < n) {
                v[j] = h ? xr[i] + dr[i] : xr[i];
                ss = fmaf(v[j], v[j], ss);
            }
        }
        if (h) {
#pragma unroll
            for (int j = 0; j < kNormHeld; ++j) {
                const int i = threadIdx.x + j * kNormThreads;
                if (i < n) h[size_t(t) * n + i] = v[j];
            }
        }
        ss = detail::block_sum(ss, shm);
        const float scale = rsqrtf(ss / float(n) + eps);
#pragma unroll
        for (int j = 0; j < kNormHeld; ++j) {
            const int i = threadIdx.x + j * kNormThreads;
            if (i < n) o[i] = v[j] * scale * w[i];
        }
        return;
    }
    const float* xr;
    if (h) {
        // Fused residual add: h += delta, then normalise h.
        float* hr = h + size_t(t) * n;
        const float* dr = delta + size_t(t) * n;
        for (int i = threadIdx.x; i < n; i += blockDim.x) hr[i] += dr[i];
        __syncthreads();
        xr = hr;
    } else {
        xr = x + size_t(t) * ldx;
    }
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
    ss = detail::block_sum(ss, shm);
    const float scale = rsqrtf(ss / float(n) + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = xr[i] * scale * w[i];
}

__global__ void embed_kernel(const uint8_t* table, size_t row_bytes, int type, int cols,
                             const int32_t* tokens, float* out) {
    pdl_entry();
    pdl_release();
    const int t = blockIdx.x;
    const uint8_t* row = table + size_t(tokens[t]) * row_bytes;
    float* o = out + size_t(t) * cols;
    if (cols % 32) {
        // Float tables only (checked by the launcher): element by element.
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {
            if (type == EH_TYPE_F32) o[c] = reinterpret_cast<const float*>(row)[c];
            else if (type == EH_TYPE_F16) o[c] = __half2float(reinterpret_cast<const __half*>(row)[c]);
            else o[c] = __uint_as_float(uint32_t(reinterpret_cast<const uint16_t*>(row)[c]) << 16);
        }
        return;
    }
    for (int c = threadIdx.x; c < cols / 32; c += blockDim.x) {
        float v[32];
        dispatch_type(type, [&]<int T>() { load_chunk<T>(row, c, v); });
#pragma unroll
        for (int j = 0; j < 32; ++j) o[32 * c + j] = v[j];
    }
}

// Block row blockIdx.x per token; the gridDim.y blocks of a row share its
// rotation pairs of every Q and K head, then its copy of V (and K's
// unrotated tail) into the cache. Decode uses several blocks per token: one
// block walking Phi-3's 3 072 pairs (powf + sincosf each) took ~15 us.
__global__ void rope_kernel(RopeArgs a) {
    pdl_entry();
    const int t = blockIdx.x;
    const int tid = blockIdx.y * blockDim.x + threadIdx.x, nthr = gridDim.y * blockDim.x;
    const int pos = a.d_pos ? a.d_pos[t] : *a.d_pos0 + t;
    const size_t cache_row = a.d_rows ? size_t(a.d_rows[t]) : size_t(pos);
    float* row = a.qkv + size_t(t) * a.ld;
    const int hd = a.head_dim, half_rot = a.n_rot / 2;
    const int nq = a.n_head * hd;
    const int nk = a.n_kv * hd;
    __half* kc = a.k_cache + cache_row * nk;
    __half* vc = a.v_cache + cache_row * nk;
    const int pairs = (a.n_head + a.n_kv) * half_rot;
    for (int p = tid; p < pairs; p += nthr) {
        const int head = p / half_rot, i = p % half_rot;
        float sn, cs;
        detail::rope_sincos(pos, i, a.n_rot, a.freq_base, a.freq_factors, &sn, &cs);
        const int i0 = detail::rope_i0(i, half_rot, a.neox);
        const int i1 = detail::rope_i1(i, half_rot, a.neox);
        float* base = head < a.n_head ? row + head * hd : row + nq + (head - a.n_head) * hd;
        float y0, y1;
        detail::rope_rotate(base[i0], base[i1], sn, cs, &y0, &y1);
        if (head < a.n_head) {
            base[i0] = y0;
            base[i1] = y1;
        } else {
            __half* kd = kc + (head - a.n_head) * hd;
            kd[i0] = __float2half_rn(y0);
            kd[i1] = __float2half_rn(y1);
        }
    }
    // Unrotated K dims (partial rotary) and all of V.
    const float* krow = row + nq;
    const float* vrow = row + nq + nk;
    for (int e = tid; e < nk; e += nthr) {
        if ((e % hd) >= a.n_rot) kc[e] = __float2half_rn(krow[e]);
        vc[e] = __float2half_rn(vrow[e]);
    }
}

// One warp per (token, head): heads 0..n_head-1 are Q, the next n_kv K
// (K follows Q in the row).
__global__ void head_rmsnorm_kernel(float* qkv, int ld, int n_head, int hd, const float* wq, const float* wk,
                                    float eps) {
    pdl_entry();
    pdl_release();
    const int t = blockIdx.x, head = blockIdx.y;
    float* x = qkv + size_t(t) * ld + size_t(head) * hd;
    const float* w = head < n_head ? wq : wk;
    const float scale = detail::head_rms_scale(x, hd, eps, threadIdx.x);
    for (int i = threadIdx.x; i < hd; i += 32) x[i] = x[i] * scale * w[i];
}

__global__ void record_kernel(int32_t* hist, const int32_t* d_pos0, const int32_t* tokens, int n) {
    pdl_entry();
    pdl_release();
    const int pos0 = *d_pos0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        hist[pos0 + i] = tokens[i];
}

}  // namespace

void record_tokens(int32_t* hist, const int32_t* d_pos0, const int32_t* tokens, int n,
                   cudaStream_t stream) {
    if (n <= 0) return;
    launch("record_kernel", record_kernel, (n + 255) / 256, 256, 0, stream, hist, d_pos0, tokens, n);
    EHC_LAUNCHED("record_kernel");
}

std::string check_kernel_image() {
    cudaFuncAttributes attr{};
    cudaError_t err = cudaFuncGetAttributes(&attr, record_kernel);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return std::string("kernel image not loadable on this device: ") + cudaGetErrorString(err);
    }
    return "";
}

void rmsnorm(const float* x, int ldx, const float* w, float* out, int ldo, int n, int ntok,
             float eps, cudaStream_t stream) {
    if (ntok <= 0) return;
    launch("rmsnorm_kernel", rmsnorm_kernel, ntok, kNormThreads, 0, stream, x, ldx, nullptr, nullptr, w, out, ldo, n, eps);
    EHC_LAUNCHED("rmsnorm_kernel");
}

void add_rmsnorm(float* h, const float* delta, const float* w, float* out, int n, int ntok,
                 float eps, cudaStream_t stream) {
    if (ntok <= 0) return;
    launch("rmsnorm_kernel", rmsnorm_kernel, ntok, kNormThreads, 0, stream, nullptr, n, h, delta, w, out, n, n, eps);
    EHC_LAUNCHED("add_rmsnorm_kernel");
}

void embed_rows(const WeightRef& table, const int32_t* tokens, int ntok, float* out,
                cudaStream_t stream) {
    if (ntok <= 0) return;
    const bool float_type = table.type == EH_TYPE_F32 || table.type == EH_TYPE_F16 || table.type == EH_TYPE_BF16;
    if (!matmul_type_supported(table.type) || table.cols <= 0 || (table.cols % 32 && !float_type))
        throw ehp::Error(EH_UNSUPPORTED, "embedding: unsupported table type " + std::to_string(table.type) +
                                             " or width " + std::to_string(table.cols));
    launch("embed_kernel", embed_kernel, ntok, 128, 0, stream, static_cast<const uint8_t*>(table.data), table.row_bytes,
                                           int(table.type), table.cols, tokens, out);
    EHC_LAUNCHED("embed_kernel");
}

void head_rmsnorm(float* qkv, int ld, int n_head, int n_kv, int head_dim, const float* q_norm,
                  const float* k_norm, int ntok, float eps, cudaStream_t stream) {
    if (ntok <= 0) return;
    if (!qkv || !q_norm || !k_norm || head_dim <= 0 || ld < (n_head + n_kv) * head_dim)
        throw ehp::Error(EH_INTERNAL, "head_rmsnorm: bad arguments");
    launch("head_rmsnorm_kernel", head_rmsnorm_kernel, dim3(ntok, n_head + n_kv), 32, 0, stream, qkv, ld, n_head,
           head_dim, q_norm, k_norm, eps);
    EHC_LAUNCHED("head_rmsnorm_kernel");
}

__global__ void gather_rows_kernel(const float* src, int ld, const int32_t* idx, int cols, float* dst) {
    pdl_entry();
    const float* from = src + size_t(idx[blockIdx.x]) * ld;
    float* to = dst + size_t(blockIdx.x) * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) to[c] = from[c];
}

void gather_rows(const float* src, int ld, const int32_t* d_idx, int n, int cols, float* dst, cudaStream_t stream) {
    if (n <= 0) return;
    launch("gather_rows_kernel", gather_rows_kernel, n, 256, 0, stream, src, ld, d_idx, cols, dst);
    EHC_LAUNCHED("gather_rows_kernel");
}

__global__ void copy_tokens_kernel(const int32_t* src, const int32_t* pairs, int n, int32_t* dst) {
    pdl_entry();
    const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n && pairs[2 * i] >= 0) dst[pairs[2 * i]] = src[pairs[2 * i + 1]];
}

void copy_tokens(const int32_t* src, const int32_t* d_pairs, int n, int32_t* dst, cudaStream_t stream) {
    if (n <= 0) return;
    launch("copy_tokens_kernel", copy_tokens_kernel, (n + 127) / 128, 128, 0, stream, src, d_pairs, n, dst);
    EHC_LAUNCHED("copy_tokens_kernel");
}

void rope_store_kv(const RopeArgs& a, cudaStream_t stream) {
    if (a.kv_type && a.kv_type != EH_TYPE_F16) return rope_store_kv_quant(a, stream);
    if (a.ntok <= 0) return;
    if (!a.d_pos != !a.d_rows) throw ehp::Error(EH_INTERNAL, "rope: d_pos and d_rows come together");
    if (a.n_rot <= 0 || a.n_rot > a.head_dim || a.n_rot % 2)
        throw ehp::Error(EH_INTERNAL, "rope: bad rotary dimension");
    // Few tokens (decode, batched GEMV prefill): spread each token's pairs
    // over enough blocks for one pair per thread; a prompt already gives one
    // block per token.
    const int pairs = (a.n_head + a.n_kv) * (a.n_rot / 2);
    const int per_token = a.ntok >= 32 ? 1 : std::max(1, std::min(32, (pairs + 255) / 256));
    launch("rope_kernel", rope_kernel, dim3(a.ntok, per_token), 256, 0, stream, a);
    EHC_LAUNCHED("rope_kernel");
}

namespace {
__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__global__ void busy_wait_kernel(unsigned long long ns) {
    const unsigned long long t0 = global_ns();
    while (global_ns() - t0 < ns) {
    }
}
}  // namespace

void gpu_busy_wait(uint32_t us, cudaStream_t stream) {
    busy_wait_kernel<<<1, 1, 0, stream>>>(1000ull * us);
    EHC_LAUNCHED("busy_wait_kernel");
}

}  // namespace ehcuda
