#include <climits>
#include <cmath>

#include "block_reduce.cuh"
#include "ehcuda/check.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/philox.cuh"
#include "ehcuda/sampler.hpp"

#include <engine_host/plugin_abi.hpp>

namespace ehcuda {
namespace {

constexpr int kThreads = 1024;

// Order-preserving map float -> uint32 (larger float, larger key).
__device__ __forceinline__ uint32_t fkey(float f) {
    uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_to_float(uint32_t k) {
    uint32_t u = (k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k;
    return __uint_as_float(u);
}

// Is token i allowed by the row's allowed-token bitset (none: all are)?
__device__ __forceinline__ bool allowed(const uint32_t* mask, int i) {
    return !mask || ((__ldg(mask + (i >> 5)) >> (i & 31)) & 1u);
}

// block_argmax over the allowed tokens of v[0, n), where v[0] is token
// `base` of the row; INT_MAX when none is allowed.
__device__ int block_argmax_allowed(const float* v, int n, int base, const uint32_t* mask, float* shm_v, int* shm_i) {
    float best = -INFINITY;
    int bi = INT_MAX;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        if (!allowed(mask, base + i)) continue;
        const float x = v[i];
        if (x > best || (x == best && i < bi)) { best = x; bi = i; }
    }
    shm_v[threadIdx.x] = best;
    shm_i[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const float ov = shm_v[threadIdx.x + s];
            const int oi = shm_i[threadIdx.x + s];
            if (ov > shm_v[threadIdx.x] || (ov == shm_v[threadIdx.x] && oi < shm_i[threadIdx.x])) {
                shm_v[threadIdx.x] = ov;
                shm_i[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    const int r = shm_i[0];
    __syncthreads();
    return r;
}

// The row's allowed-token bitset, or null.
__device__ __forceinline__ const uint32_t* row_mask(const RowEdits* rows, const uint32_t* masks, int row) {
    if (!rows || !masks) return nullptr;
    const int w = rows[row].mask_word;
    return w >= 0 ? masks + w : nullptr;
}

// Plain greedy over a large vocabulary: one block walking 152k logits took
// ~55 us per token (Qwen2.5 on an H100), so kArgmaxBlocks blocks each find
// the best of one contiguous slice first (value, lowest index), into the
// sampler's work buffers; sample_kernel then reduces the partials. Other
// settings return at once and leave the whole pipeline to sample_kernel.
constexpr int kArgmaxBlocks = 128;
constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxMinVocab = 8192;

// (the penalties come before, in adjust_logits: greedy is temperature 0)
__device__ __forceinline__ bool plain_greedy(const SamplerParams& P) { return !(P.temperature > 0.0f); }

__global__ void __launch_bounds__(kArgmaxThreads) argmax_partial_kernel(const float* logits, int V,
                                                                      const SamplerParams* pp, float* pv,
                                                                      int32_t* pi, int ld, int work_ld,
                                                                      const RowEdits* rows, const uint32_t* masks) {
    pdl_entry();
    pdl_release();
    // Row blockIdx.y of a batch: its logits, params and work.
    logits += size_t(blockIdx.y) * ld;
    pp += blockIdx.y;
    pv += size_t(blockIdx.y) * work_ld;
    pi += size_t(blockIdx.y) * work_ld;
    __shared__ float shm_v[kArgmaxThreads];
    __shared__ int shm_i[kArgmaxThreads];
    if (!plain_greedy(*pp)) return;
    const int slice = (V + gridDim.x - 1) / gridDim.x;
    const int lo = blockIdx.x * slice, hi = min(V, lo + slice);
    // The allowed-token mask is applied here, as the logits are read (not
    // by a pass of its own over the row).
    const int idx = block_argmax_allowed(logits + lo, max(0, hi - lo), lo, row_mask(rows, masks, blockIdx.y), shm_v,
                                         shm_i);
    if (threadIdx.x == 0) {
        // No allowed token in the slice, or only NaNs: keep that from
        // beating a real candidate.
        const bool real = idx != INT_MAX && logits[lo + idx] == logits[lo + idx];
        pv[blockIdx.x] = real ? logits[lo + idx] : -INFINITY;
        pi[blockIdx.x] = real ? lo + idx : INT_MAX;
    }
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* logits, int V, const SamplerParams* pp,
                                                        unsigned long long* counter, float* w, int32_t* first,
                                                        int32_t* out, int partials, int ld, int work_ld,
                                                        const RowEdits* rows, const uint32_t* masks) {
    pdl_entry();
    pdl_release();
    // Row blockIdx.x of a batch: its logits, params, draw counter, work and
    // result.
    logits += size_t(blockIdx.x) * ld;
    pp += blockIdx.x;
    counter += blockIdx.x;
    w += size_t(blockIdx.x) * work_ld;
    first += size_t(blockIdx.x) * work_ld;
    out += blockIdx.x;
    const uint32_t* mask = row_mask(rows, masks, blockIdx.x);  // applied as the logits are read
    // Thread 0 alone writes the result.
    auto finish = [&](int pick) { *out = pick; };
    __shared__ float red[32];
    __shared__ float shm_v[kThreads];
    __shared__ int shm_i[kThreads];
    __shared__ unsigned int hist256[256];
    __shared__ uint32_t sh_prefix;
    __shared__ int sh_krem;
    __shared__ int sh_pick;
    const int tid = threadIdx.x;
    const SamplerParams P = *pp;

    // 1. Greedy (temperature 0): no working copy needed.
    if (plain_greedy(P)) {
        if (partials) {
            // Best of the slices' winners: larger value, then lower index.
            float best = -INFINITY;
            int bi = INT_MAX;
            for (int i = tid; i < partials; i += blockDim.x) {
                const float v = w[i];
                const int j = first[i];
                if (v > best || (v == best && j < bi)) { best = v; bi = j; }
            }
            shm_v[tid] = best;
            shm_i[tid] = bi;
            __syncthreads();
            for (int st = blockDim.x / 2; st > 0; st >>= 1) {
                if (tid < st) {
                    const float ov = shm_v[tid + st];
                    const int oi = shm_i[tid + st];
                    if (ov > shm_v[tid] || (ov == shm_v[tid] && oi < shm_i[tid])) {
                        shm_v[tid] = ov;
                        shm_i[tid] = oi;
                    }
                }
                __syncthreads();
            }
            if (tid == 0) finish(shm_i[0] == INT_MAX ? 0 : shm_i[0]);
            return;
        }
        const int idx = block_argmax_allowed(logits, V, 0, mask, shm_v, shm_i);
        if (tid == 0) finish(idx == INT_MAX ? 0 : idx);
        return;
    }
    for (int i = tid; i < V; i += blockDim.x) w[i] = allowed(mask, i) ? logits[i] : -INFINITY;
    __syncthreads();

    // 2. Temperature.
    const float inv_t = 1.0f / P.temperature;
    float mx = -INFINITY;
    for (int i = tid; i < V; i += blockDim.x) {
        w[i] *= inv_t;
        mx = fmaxf(mx, w[i]);
    }
    __syncthreads();
    mx = detail::block_max(mx, red);

    // 3. Top-k: radix-select the key of the k-th largest logit (8 bits a
    //    pass); everything at or above it stays (ties are all kept).
    float thr = -INFINITY;
    if (P.top_k > 0 && P.top_k < V) {
        if (tid == 0) { sh_prefix = 0; sh_krem = P.top_k; }
        for (int pass = 0; pass < 4; ++pass) {
            const int shift = 24 - 8 * pass;
            const uint32_t hi_mask = pass == 0 ? 0u : (0xFFFFFFFFu << (shift + 8));
            for (int b = tid; b < 256; b += blockDim.x) hist256[b] = 0;
            __syncthreads();
            const uint32_t prefix = sh_prefix;
            for (int i = tid; i < V; i += blockDim.x) {
                uint32_t k = fkey(w[i]);
                if ((k & hi_mask) == (prefix & hi_mask)) atomicAdd(&hist256[(k >> shift) & 255], 1u);
            }
            __syncthreads();
            if (tid == 0) {
                int rem = sh_krem;
                for (int b = 255; b >= 0; --b) {
                    int c = int(hist256[b]);
                    if (c >= rem) {
                        sh_prefix = prefix | (uint32_t(b) << shift);
                        break;
                    }
                    rem -= c;
                }
                sh_krem = rem;
            }
            __syncthreads();
        }
        thr = key_to_float(sh_prefix);
    }

    // 4. Unnormalised probabilities (the max has p = 1).
    float z = 0.0f;
    for (int i = tid; i < V; i += blockDim.x) {
        float p = w[i] >= thr ? __expf(w[i] - mx) : 0.0f;
        w[i] = p;
        z += p;
    }
    __syncthreads();
    z = detail::block_sum(z, red);

    // 5. Top-p: the largest cut t with sum{p >= t} >= top_p * Z, found by
    //    bisection on the bit pattern of t (positive floats order as ints).
    float cut = 0.0f;
    if (P.top_p < 1.0f && P.top_p > 0.0f) {
        const float target = P.top_p * z;
        uint32_t lo = 0, hi = __float_as_uint(1.0f);  // F(lo) >= target holds
        while (lo < hi) {
            const uint32_t mid = lo + (hi - lo + 1) / 2;
            const float t = __uint_as_float(mid);
            float s = 0.0f;
            for (int i = tid; i < V; i += blockDim.x) s += w[i] >= t ? w[i] : 0.0f;
            s = detail::block_sum(s, red);
            if (s >= target) lo = mid; else hi = mid - 1;
        }
        cut = __uint_as_float(lo);
    }
    // 6. Min-p relative to the most likely token (p_max = 1).
    if (P.min_p > 0.0f) cut = fmaxf(cut, P.min_p);

    // 7. Inverse-CDF draw over contiguous per-thread ranges in index order.
    const int per = (V + blockDim.x - 1) / blockDim.x;
    const int b0 = min(V, tid * per), b1 = min(V, b0 + per);
    float local = 0.0f;
    int last_kept = -1;
    for (int i = b0; i < b1; ++i) {
        float p = w[i] >= cut ? w[i] : 0.0f;
        local += p;
        if (p > 0.0f) last_kept = i;
    }
    shm_v[tid] = local;
    shm_i[tid] = last_kept;
    __syncthreads();
    if (tid == 0) {
        float run = 0.0f;
        int lk = -1;
        for (int t = 0; t < (int)blockDim.x; ++t) {
            float s = shm_v[t];
            shm_v[t] = run;  // exclusive prefix
            run += s;
            if (shm_i[t] >= 0) lk = shm_i[t];
        }
        red[0] = run;
        sh_pick = lk < 0 ? 0 : lk;  // fallback when rounding overshoots
    }
    __syncthreads();
    const float total = red[0];
    const unsigned long long ctr = *counter;
    const float u = philox_uniform(P.seed, ctr);
    const float target = u * total;
    const float e0 = shm_v[tid];
    if (target >= e0 && target < e0 + local) {
        float run = e0;
        for (int i = b0; i < b1; ++i) {
            float p = w[i] >= cut ? w[i] : 0.0f;
            run += p;
            if (p > 0.0f && target < run) {
                sh_pick = i;
                break;
            }
        }
    }
    __syncthreads();
    if (tid == 0) {
        *counter = ctr + 1;
        finish(sh_pick);
    }
}

}  // namespace

void sample_rows(const float* logits, int ld, int n_rows, int n_vocab, const SamplerParams* d_params,
                 unsigned long long* d_counters, SamplerWork work, int32_t* d_out, cudaStream_t stream,
                 const RowEdits* d_rows, const uint32_t* d_masks) {
    if (n_rows <= 0) return;
    if (n_vocab <= 0 || ld < n_vocab) throw ehp::Error(EH_INTERNAL, "sample_rows: bad shape");
    if (n_rows > 65535) throw ehp::Error(EH_INTERNAL, "sample_rows: more than 65535 rows");
    const int partials = n_vocab >= kArgmaxMinVocab ? kArgmaxBlocks : 0;
    if (partials)
        launch("argmax_partial_kernel", argmax_partial_kernel, dim3(partials, n_rows), kArgmaxThreads, 0, stream, logits,
               n_vocab, d_params, work.fwork, work.iwork, ld, n_vocab, d_rows, d_masks);
    launch("sample_kernel", sample_kernel, n_rows, kThreads, 0, stream, logits, n_vocab, d_params, d_counters,
           work.fwork, work.iwork, d_out, partials, ld, n_vocab, d_rows, d_masks);
    EHC_LAUNCHED("sample_kernel");
}

SamplerParams sampler_params_of(const eh_sampling_params& p) {
    ehp::check_sampling(p);
    SamplerParams sp;
    sp.temperature = p.temperature;
    sp.top_k = p.top_k;
    sp.top_p = p.top_p;
    sp.min_p = p.min_p;
    sp.repetition_penalty = p.repetition_penalty;
    sp.repetition_window = p.repetition_window;
    sp.seed = p.seed;
    return sp;
}

}  // namespace ehcuda
