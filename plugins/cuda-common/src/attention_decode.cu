// Decode attention over the FP16 KV cache, one query token per sequence.
//
// Split-K: the KV range is split into chunks; each block reduces its chunk
// to (max, sum, weighted V) and the chunks are merged in split order.
// Nothing is accumulated with atomics, so results are bitwise reproducible.
//
// attention_decode (attention_decode_split.cu): a decode kernel and a merge
// kernel (the tests' second opinion on the fused one). The sink attention
// of gpt-oss is the same scheme in attention_decode_sinks.cu.
//
// rope_attention_decode: the scheme in one launch per layer instead of
// rope_store_kv + decode + merge. Each block rotates its own Q; the blocks
// whose split holds the new position rotate its K and attend it from shared
// memory, one of them per KV head stores it; the last split of a head to
// finish (per-head counter) merges all splits in split order. H100,
// Qwen2.5-0.5B at ~577 keys: 9.7 us per layer against 4.2 + 7.2 + 6.0 us for
// the three kernels (ncu). The same kernel serves a batched step's decode
// rows (DecodeAttnArgs::paged): one grid slice per row, keys through the
// row's block table into the paged pool. With QK-norm weights it also
// normalises Q and the new K (Qwen3) instead of a head_rmsnorm launch.
// A quantized pool (DecodeAttnArgs::kv_type Q8_0 / FP8_E4M3, paged rows
// only): the new K and V are quantized in shared memory as
// rope_store_kv_quant does (kv_quant.cuh) and stored as codes and scales,
// and every key, the new one too, is attended as scale * code, as the pool
// holds it.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "attention_decode.cuh"
#include "attention_dispatch.cuh"
#include "block_reduce.cuh"
#include "gemv_stage.cuh"
#include "head_norm.cuh"
#include "ehcuda/attention_paged.hpp"
#include "ehcuda/check.hpp"
#include "ehcuda/kernels.hpp"
#include "ehcuda/launch.cuh"
#include "kv_prefetch.cuh"
#include "kv_quant.cuh"
#include "online_softmax.cuh"
#include "rope.cuh"

namespace ehcuda {
namespace {

using detail::by_dpl;
using detail::kDecodeWarps;
using detail::kKeysPerIter;
using detail::kMaxDecodeSplits;
using detail::kMinChunk;
using detail::validate;

// Splits the fused kernel's last block merges from registers (one scratch
// load round); more take the shared-memory path. (Merging a head's splits
// through a thread-block cluster's shared memory instead of this scratch,
// fence and counter lost: clusters of 16 blocks over a head's splits, H200,
// tg128 after 512 tokens, Qwen2.5-0.5B +0.8 %, Phi-3-mini, gpt-oss-20b and
// Qwen3-30B-A3B -13 to -16 %, as only a few 16-block clusters are resident
// at once; and the kernel with the cluster path compiled in but off ran
// those models 2-5 % slower.)
constexpr int kOneRoundMerge = 32;
// The fused kernel runs at most this many splits of a head, however many the
// grid holds: deeper sequences get longer chunks instead. H200, Qwen2.5-0.5B
// tg128 after 16,384 tokens, 8 keys per warp round: 128 active splits of 128
// keys 746 tok/s, 64 of 256 850 (after 4,096 and 512 tokens the cap changes
// nothing: 68 and 9 splits of 64 keys).
constexpr int kMaxActiveSplits = 64;

// ---- Fused decode: RoPE + KV store + split-K attention + merge ----------
//
// Grid (head, split), kDecodeWarps warps per block. Only the splits the
// current length needs run (nact of them, from *d_pos0, the same in every
// block); the rest exit at once. Splits are at least min_chunk keys.

// Loads the K and V rows of keys kb .. kb+G-1 (clamped to ke-1; masked when
// scored) into registers as stored (FP16, converted where they are scored:
// converting here made the warp wait for the loads before the RoPE work they
// are meant to overlap), lane l holding dims l + 32 i. Row qpos is being
// written by this launch, so it is never read here: its slots (and the
// masked ones past it) load `spare`, readable memory nobody writes during
// the launch, and are overwritten from shared memory before use (see the
// kernel). A select, not a branch: a branch per key kept the compiler from
// hoisting the loads, and each key then paid a full memory latency.
// Paged: key k's row is table[k / kPagedBlockTokens] * kPagedBlockTokens +
// k % kPagedBlockTokens; else row k.
template <bool Paged>
__device__ __forceinline__ size_t key_row(const int32_t* table, int key) {
    if constexpr (Paged)
        return size_t(table[key / kPagedBlockTokens]) * kPagedBlockTokens + key % kPagedBlockTokens;
    else
        return size_t(key);
}

// detail::prefetch_kv_rows through a block table: asks L2 for the K and V
// rows of keys k0 .. k1 (inclusive), one prefetch per 64 bytes.
__device__ __forceinline__ void prefetch_paged_rows(const __half* kc, const __half* vc, int kv_ld, int hd,
                                                    const int32_t* table, int kbase, int k0, int k1) {
    const int pieces = (hd * int(sizeof(__half)) + 63) / 64;
    const int n = 2 * (k1 - k0 + 1) * pieces;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int j = i >> 1, key = k0 + j / pieces, piece = j % pieces;
        const __half* row = ((i & 1) ? vc : kc) + key_row<true>(table, key - kbase) * kv_ld;
        prefetch_l2(reinterpret_cast<const char*>(row) + 64 * piece);
    }
}

template <int DPL, int G, bool Paged>
__device__ __forceinline__ void load_key_group(const __half* kc, const __half* vc, const __half* spare, int kv_ld,
                                               const int32_t* table, int kbase, int kb, int ke, int qpos, int lane,
                                               __half (&kh)[G][DPL], __half (&vh)[G][DPL]) {
#pragma unroll
    for (int j = 0; j < G; ++j) {
        const int key = min(kb + j, ke - 1);
        const bool fresh = key == qpos;
        const size_t kr_at = key_row<Paged>(table, key - kbase) * kv_ld;
        const __half* kr = fresh ? spare : kc + kr_at;
        const __half* vr = fresh ? spare : vc + kr_at;
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
            kh[j][i] = kr[lane + 32 * i];
            vh[j][i] = vr[lane + 32 * i];
        }
    }
}

// A head's DPL scales from p (its first): one 4-, 8- or 16-byte load where
// DPL is 2, 4 or 8 (the scales of a head of 64, 128, 256 start 4-, 8- and
// 16-byte aligned in a row and in `spare`), else one load each.
template <int DPL>
__device__ __forceinline__ void load_head_scales(const uint8_t* p, __half (&s)[DPL]) {
    if constexpr (DPL == 2 || DPL == 4 || DPL == 8) {
        using W = std::conditional_t<DPL == 2, uint32_t, std::conditional_t<DPL == 4, uint2, uint4>>;
        const W w = *reinterpret_cast<const W*>(p);
        const unsigned short* h = reinterpret_cast<const unsigned short*>(&w);
#pragma unroll
        for (int i = 0; i < DPL; ++i) s[i] = __ushort_as_half(h[i]);
    } else {
#pragma unroll
        for (int i = 0; i < DPL; ++i) s[i] = reinterpret_cast<const __half*>(p)[i];
    }
}

// prefetch_paged_rows for a quantized pool: each key's codes of the head
// (hd bytes, in 64-byte pieces) and its scales (one more piece).
__device__ __forceinline__ void prefetch_quant_rows(const uint8_t* kc, const uint8_t* vc, size_t rs, int soff, int hd,
                                                    const int32_t* table, int kbase, int k0, int k1) {
    const int pieces = (hd + 63) / 64 + 1;
    const int n = 2 * (k1 - k0 + 1) * pieces;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int j = i >> 1, key = k0 + j / pieces, piece = j % pieces;
        const uint8_t* row = ((i & 1) ? vc : kc) + key_row<true>(table, key - kbase) * rs;
        prefetch_l2(piece + 1 == pieces ? row + soff : row + 64 * piece);
    }
}

// load_key_group over a quantized pool (rows of rs bytes): each key's codes
// (lane l: dims l + 32 i) and the scale of each of the lane's 32-value
// blocks, as stored; `soff` is the bytes from a head's codes to its first
// scale. Fresh and masked slots read `spare` as load_key_group's do.
template <int DPL, int G, bool Paged>
__device__ __forceinline__ void load_key_group_quant(const uint8_t* kc, const uint8_t* vc, const uint8_t* spare,
                                                     size_t rs, int soff, const int32_t* table, int kbase, int kb,
                                                     int ke, int qpos, int lane, uint8_t (&kq)[G][DPL],
                                                     uint8_t (&vq)[G][DPL], __half (&ks)[G][DPL],
                                                     __half (&vs)[G][DPL]) {
#pragma unroll
    for (int j = 0; j < G; ++j) {
        const int key = min(kb + j, ke - 1);
        const bool fresh = key == qpos;
        const size_t at = key_row<Paged>(table, key - kbase) * rs;
        const uint8_t* kr = fresh ? spare : kc + at;
        const uint8_t* vr = fresh ? spare : vc + at;
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
            kq[j][i] = kr[lane + 32 * i];
            vq[j][i] = vr[lane + 32 * i];
        }
        load_head_scales<DPL>(kr + soff, ks[j]);
        load_head_scales<DPL>(vr + soff, vs[j]);
    }
}

// The eh_tensor_type of a cache element tag (F16 for __half).
template <class C>
constexpr uint32_t kv_tag_type() {
    if constexpr (detail::kQuantKv<C>) return C::kType;
    else return EH_TYPE_F16;
}

// The rotary angle of pair i at position pos: the model's frequencies, or
// (inv_freq set) its table scaled by attn_factor, as rope_table_store_kv
// (gpt_ops.cu) computes it, so both leave the same bits in the cache.
__device__ __forceinline__ void rope_angle(const DecodeAttnArgs& a, int pos, int i, float* sn, float* cs) {
    if (a.inv_freq) {
        sincosf(float(pos) * a.inv_freq[i], sn, cs);
        *cs *= a.attn_factor;
        *sn *= a.attn_factor;
    } else {
        detail::rope_sincos(pos, i, a.n_rot, a.freq_base, a.freq_factors, sn, cs);
    }
}

// 1 / the softmax denominator of a head whose keys gave maximum M and sum
// L (relative to M), as the factor the outputs (relative to M) take; with
// sinks the head's sink logit joins the denominator.
__device__ __forceinline__ float out_scale(const DecodeAttnArgs& a, int head, float M, float L) {
    if (!a.sinks) return L > 0.0f ? 1.0f / L : 0.0f;
    const float sk = a.sinks[head], Mo = fmaxf(M, sk);
    const float f = M == -INFINITY ? 0.0f : __expf(M - Mo);
    return f / (L * f + __expf(sk - Mo));
}

// o[d] of head `head` is val; with chunks (one row only) also element d of
// the head's integer chunks (xb bits). d runs over a whole warp's 32 consecutive dims
// (head dims are multiples of 32), so each warp quantizes one chunk.
__device__ __forceinline__ void emit_out(const DecodeAttnArgs& a, int xb, float* o, int head, int hd, int d, float val) {
    o[d] = val;
    if (a.out_chunks) detail::store_chunk_warp_bits(xb, val, a.out_chunks, head * hd + d);
}

// G: keys a warp loads before scoring any of them (more loads in flight per
// dependent round; the unfused kernel's 4 left a 64-key split four rounds
// per warp).
// early (attention_early()): with 1 or 2 the first key group's loads (and
// with 2 an L2 request for the rest of the block's keys) go out before
// pdl_entry(), while the QKV projection still runs; the cache rows below the
// new position were written by earlier steps (kv_prefetch.cuh).
// Pipe (attention_pipe()): a warp loads its next key group before scoring
// the current one.
// Paged (DecodeAttnArgs::paged): grid slice blockIdx.z is row z of the
// batched step, with its own position, store row and block table; its
// counters and scratch follow the single row's layout, row after row.
// C: the pool's element, __half or (Paged only) a quantized tag.
template <int DPL, int G, bool Pipe, bool Paged, class C>
__global__ void __launch_bounds__(kDecodeWarps * 32) rope_attn_decode_kernel(DecodeAttnArgs a, int min_chunk, int xb,
                                                                             int early) {
    if (!early) {
        pdl_entry();
        pdl_release();
    }
    constexpr int HD = DPL * 32;
    constexpr bool kQuant = detail::kQuantKv<C>;
    static_assert(!kQuant || Paged, "a quantized pool is a batched step's");
    // A cached element as loaded: a half, or a quantized pool's code.
    using E = std::conditional_t<kQuant, uint8_t, __half>;
    constexpr int kQ = kQuant ? 1 : 0;  // sizes the quantized-only arrays
    __shared__ float sq[HD];                        // rotated q (unscaled)
    __shared__ __align__(16) E snk[HD], snv[HD];  // the new token's K (rotated) and V, as cached
    __shared__ __half snks[kQuant ? HD / 32 : 1], snvs[kQuant ? HD / 32 : 1];  // (quantized) their scales
    __shared__ float skf[kQuant ? HD : 1];  // (quantized) the new K rotated, before quantizing
    __shared__ float sm_m[kDecodeWarps], sm_l[kDecodeWarps];
    __shared__ float sm_acc[kDecodeWarps][HD];
    __shared__ bool s_last;
    __shared__ float sm_sm[kMaxDecodeSplits], sm_sl[kMaxDecodeSplits];  // merge: split maxima (then weights), sums

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int head = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y;
    const int row = Paged ? int(blockIdx.z) : 0;
    const int group = a.n_head / a.n_kv;
    const int kvh = head / group;
    const int qpos = Paged ? a.d_pos[row] : *a.d_pos0;
    const int32_t* table = Paged ? a.tables + a.d_table[row] : nullptr;
    const float* qkv = a.qkv + (Paged ? size_t(row) * a.ldqkv : 0);
    const int rh = row * a.n_head + head;  // this row's head: counters and scratch
    const int len = qpos + 1;
    const int kstart = a.window > 0 ? max(0, qpos - a.window + 1) : 0;
    const int range = len - kstart;
    const int cap = min(nsplit, kMaxActiveSplits);
    const int chunk = max(min_chunk, (range + cap - 1) / cap);
    const int nact = (range + chunk - 1) / chunk;
    if (split >= nact) return;
    const int ks = kstart + split * chunk;
    const int ke = min(len, ks + chunk);
    const bool has_new = ke == len;  // this split attends the new key
    const int kv_ld = a.n_kv * HD;
    const __half* kc = a.k_cache + kvh * HD;
    const __half* vc = a.v_cache + kvh * HD;
    // The qkv row (only read in this launch) holds at least n_kv * HD halves.
    const __half* spare = reinterpret_cast<const __half*>(qkv) + kvh * HD;
    // (quantized) the pool's bytes: a head's codes, the bytes from them to
    // its scales, the row size; `spare` as bytes (the qkv row holds far more)
    const uint8_t* kcq = reinterpret_cast<const uint8_t*>(a.k_cache) + kvh * HD;
    const uint8_t* vcq = reinterpret_cast<const uint8_t*>(a.v_cache) + kvh * HD;
    const int soff = kv_ld - kvh * HD + kvh * HD / 16;
    const size_t rs = kv_row_bytes(kv_tag_type<C>(), kv_ld);
    const uint8_t* spareq = reinterpret_cast<const uint8_t*>(qkv) + kvh * HD;

    // Paged: the split's block ids into shared memory first, so that a key's
    // row is a shared read, not a dependent global load, inside the key
    // loop (key_row then takes keys relative to the first block's).
    constexpr int kShBlocks = 64;
    __shared__ int32_t s_blk[kShBlocks];
    int kbase = 0;
    if constexpr (Paged) {
        const int b0 = ks / kPagedBlockTokens, nb = (ke - 1) / kPagedBlockTokens - b0 + 1;
        if (nb <= kShBlocks) {
            for (int i = threadIdx.x; i < nb; i += blockDim.x) s_blk[i] = table[b0 + i];
            __syncthreads();
            table = s_blk;
            kbase = b0 * kPagedBlockTokens;
        }
    }

    // The first key group's loads go out before RoPE, which then hides part
    // of their latency.
    E kh[G][DPL], vh[G][DPL];
    __half khs[kQ * G + 1 - kQ][kQ * DPL + 1 - kQ], vhs[kQ * G + 1 - kQ][kQ * DPL + 1 - kQ];  // (quantized) scales
    auto load = [&](int k0) {
        if constexpr (kQuant)
            load_key_group_quant<DPL, G, Paged>(kcq, vcq, spareq, rs, soff, table, kbase, k0, ke, qpos, lane, kh, vh, khs,
                                                vhs);
        else
            load_key_group<DPL, G, Paged>(kc, vc, spare, kv_ld, table, kbase, k0, ke, qpos, lane, kh, vh);
    };
    int kb = ks + warp * G;
    if (kb < ke) load(kb);
    // The thread's first rotary angle needs only the position.
    const int half_rot = a.n_rot / 2;
    float sn0 = 0.0f, cs0 = 1.0f;
    if (int(threadIdx.x) < half_rot) rope_angle(a, qpos, threadIdx.x, &sn0, &cs0);
    if (early) {
        // (`spare` may be read while the QKV projection writes it: those
        // slots are overwritten before use.)
        if (early >= 2 && ks + kDecodeWarps * G < ke) {
            if constexpr (kQuant)
                prefetch_quant_rows(kcq, vcq, rs, soff, HD, table, kbase, ks + kDecodeWarps * G, min(ke, qpos) - 1);
            else if constexpr (Paged)
                prefetch_paged_rows(kc, vc, kv_ld, HD, table, kbase, ks + kDecodeWarps * G, min(ke, qpos) - 1);
            else
                detail::prefetch_kv_rows(kc, vc, kv_ld, 0, HD, ks + kDecodeWarps * G, min(ke, qpos) - 1);
        }
        pdl_entry();
        pdl_release();
    }

    const float* qrow = qkv + head * HD;
    const float* krow = qkv + a.n_head * HD + kvh * HD;
    const float* vrow = qkv + (a.n_head + a.n_kv) * HD + kvh * HD;
    // QK-norm (q_norm set): the query head's scale (warp 0) and, where this
    // split holds the new key, its KV head's (warp 1), as head_rmsnorm_kernel
    // computes them, so the unfused path's bits; one launch fewer a layer.
    __shared__ float s_qscale, s_kscale;
    if (a.q_norm) {
        if (warp == 0) s_qscale = detail::head_rms_scale(qrow, HD, a.norm_eps, lane);
        if (warp == 1 && has_new) s_kscale = detail::head_rms_scale(krow, HD, a.norm_eps, lane);
        __syncthreads();
    }
    // Element d of the (normalised) query and new key.
    auto qv = [&](int d) { return a.q_norm ? qrow[d] * s_qscale * a.q_norm[d] : qrow[d]; };
    auto kv = [&](int d) { return a.q_norm ? krow[d] * s_kscale * a.k_norm[d] : krow[d]; };
    for (int i = threadIdx.x; i < half_rot; i += blockDim.x) {
        float sn = sn0, cs = cs0, y0, y1;
        if (i != int(threadIdx.x)) rope_angle(a, qpos, i, &sn, &cs);
        const int i0 = detail::rope_i0(i, half_rot, a.neox), i1 = detail::rope_i1(i, half_rot, a.neox);
        detail::rope_rotate(qv(i0), qv(i1), sn, cs, &y0, &y1);
        sq[i0] = y0;
        sq[i1] = y1;
        if (has_new) {
            detail::rope_rotate(kv(i0), kv(i1), sn, cs, &y0, &y1);
            if constexpr (kQuant) {
                skf[i0] = y0;
                skf[i1] = y1;
            } else {
                snk[i0] = __float2half_rn(y0);
                snk[i1] = __float2half_rn(y1);
            }
        }
    }
    for (int d = a.n_rot + threadIdx.x; d < HD; d += blockDim.x) {
        sq[d] = qv(d);
        if (has_new) {
            if constexpr (kQuant) skf[d] = kv(d);
            else snk[d] = __float2half_rn(kv(d));
        }
    }
    if constexpr (!kQuant) {
        if (has_new)
            for (int d = threadIdx.x; d < HD; d += blockDim.x) snv[d] = __float2half_rn(vrow[d]);
    }
    __syncthreads();
    if constexpr (kQuant) {
        // The new K and V quantized, a warp per 32-value block.
        if (has_new) {
            for (int b = warp; b < 2 * (HD / 32); b += kDecodeWarps) {
                const bool v = b >= HD / 32;
                const int e = 32 * (v ? b - HD / 32 : b);
                detail::kv_quantize_warp<C>(v ? vrow[e + lane] : skf[e + lane], (v ? snv : snk) + e,
                                            (v ? snvs : snks) + e / 32, lane);
            }
            __syncthreads();
        }
    }
    // One block per KV head stores the new K and V; nothing in this launch
    // reads them back from the cache.
    if constexpr (kQuant) {
        if (has_new && head % group == 0) {
            uint8_t* kd = reinterpret_cast<uint8_t*>(a.k_cache) + size_t(a.d_rows[row]) * rs;
            uint8_t* vd = reinterpret_cast<uint8_t*>(a.v_cache) + size_t(a.d_rows[row]) * rs;
            for (int d = threadIdx.x; d < HD; d += blockDim.x) {
                kd[kvh * HD + d] = snk[d];
                vd[kvh * HD + d] = snv[d];
            }
            for (int b = threadIdx.x; b < HD / 32; b += blockDim.x) {
                reinterpret_cast<__half*>(kd + kv_ld)[kvh * (HD / 32) + b] = snks[b];
                reinterpret_cast<__half*>(vd + kv_ld)[kvh * (HD / 32) + b] = snvs[b];
            }
        }
    } else if (has_new && head % group == 0) {
        const size_t at = size_t(Paged ? a.d_rows[row] : qpos) * kv_ld + kvh * HD;
        __half* kd = a.k_cache + at;
        __half* vd = a.v_cache + at;
        for (int d = threadIdx.x; d < HD; d += blockDim.x) {
            kd[d] = snk[d];
            vd[d] = snv[d];
        }
    }

    float q[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) q[i] = sq[lane + 32 * i] * a.scale;

    float m = -INFINITY, l = 0.0f, acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] = 0.0f;
    // Warp w takes keys ks + w*G .. +G-1, then jumps by kDecodeWarps*G.
    while (kb < ke) {
        if (has_new && kb + G > qpos) {
            // The new key from shared memory; the masked slots past it get
            // the same finite values (they loaded `spare`: any bits).
#pragma unroll
            for (int j = 0; j < G; ++j)
                if (kb + j >= qpos) {
#pragma unroll
                    for (int i = 0; i < DPL; ++i) {
                        kh[j][i] = snk[lane + 32 * i];
                        vh[j][i] = snv[lane + 32 * i];
                        if constexpr (kQuant) {
                            khs[j][i] = snks[i];
                            vhs[j][i] = snvs[i];
                        }
                    }
                }
        }
        float kf[G][DPL], vf[G][DPL];
#pragma unroll
        for (int j = 0; j < G; ++j)
#pragma unroll
            for (int i = 0; i < DPL; ++i) {
                if constexpr (kQuant) {
                    kf[j][i] = detail::kv_code(C{}, kh[j][i]) * __half2float(khs[j][i]);
                    vf[j][i] = detail::kv_code(C{}, vh[j][i]) * __half2float(vhs[j][i]);
                } else {
                    kf[j][i] = __half2float(kh[j][i]);
                    vf[j][i] = __half2float(vh[j][i]);
                }
            }
        const int kn = kb + kDecodeWarps * G;
        if (Pipe && kn < ke) load(kn);
        float s[G];
        detail::score_keys<G, DPL>(q, kf, s);
        detail::softmax_fold<G, DPL>(s, vf, ke - kb, m, l, acc);
        kb = kn;
        if (!Pipe && kb < ke) load(kb);
    }

    // The block's warps, combined in warp order.
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < DPL; ++i) sm_acc[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    float M = -INFINITY, L = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) M = fmaxf(M, sm_m[w]);
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w)
        if (sm_m[w] != -INFINITY) L += sm_l[w] * __expf(sm_m[w] - M);
    float* o = a.out + (Paged ? size_t(row) * a.ldo : 0) + size_t(head) * HD;
    if (nact == 1) {
        // The only split: the merge would scale by exp(0) = 1, so this is
        // what it would write.
        const float inv = out_scale(a, head, M, L);
        for (int d = threadIdx.x; d < HD; d += blockDim.x) {
            float A = 0.0f;
#pragma unroll
            for (int w = 0; w < kDecodeWarps; ++w)
                if (sm_m[w] != -INFINITY) A += sm_acc[w][d] * __expf(sm_m[w] - M);
            emit_out(a, xb, o, head, HD, d, A * inv);
        }
        return;
    }
    float* part = a.scratch + (size_t(rh) * nsplit + split) * (HD + 2);
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float A = 0.0f;
#pragma unroll
        for (int w = 0; w < kDecodeWarps; ++w)
            if (sm_m[w] != -INFINITY) A += sm_acc[w][d] * __expf(sm_m[w] - M);
        part[2 + d] = A;
    }
    if (threadIdx.x == 0) {
        part[0] = M;
        part[1] = L;
    }

    // Last block done: publish this split, count it; the block that counts
    // the head's last split merges them all, in split order.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned done = atomicAdd(a.counters + rh, 1u);
        s_last = done == unsigned(nact - 1);
        if (s_last) a.counters[rh] = 0;  // every split of this launch has counted
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    // Every active split has keys, so every M_s is finite.
    const float* base = a.scratch + size_t(rh) * nsplit * (HD + 2);
    if (nact <= kOneRoundMerge) {
        // One load round: each thread reads every split's maximum and sum
        // (the same words across the block) with its own dims' sums, then
        // merges in registers, in split order as below (the same bits).
        constexpr int kDims = (HD + kDecodeWarps * 32 - 1) / (kDecodeWarps * 32);
        float ms[kOneRoundMerge], ls[kOneRoundMerge], as[kDims][kOneRoundMerge];
#pragma unroll
        for (int s = 0; s < kOneRoundMerge; ++s) {
            if (s >= nact) break;
            ms[s] = __ldcg(base + size_t(s) * (HD + 2));
            ls[s] = __ldcg(base + size_t(s) * (HD + 2) + 1);
#pragma unroll
            for (int i = 0; i < kDims; ++i) {
                const int d = threadIdx.x + i * kDecodeWarps * 32;
                as[i][s] = d < HD ? __ldcg(base + size_t(s) * (HD + 2) + 2 + d) : 0.0f;
            }
        }
        M = -INFINITY;
#pragma unroll
        for (int s = 0; s < kOneRoundMerge; ++s)
            if (s < nact) M = fmaxf(M, ms[s]);
        L = 0.0f;
#pragma unroll
        for (int s = 0; s < kOneRoundMerge; ++s)
            if (s < nact) {
                ms[s] = __expf(ms[s] - M);
                L += ls[s] * ms[s];
            }
        const float inv = out_scale(a, head, M, L);
#pragma unroll
        for (int i = 0; i < kDims; ++i) {
            const int d = threadIdx.x + i * kDecodeWarps * 32;
            float A = 0.0f;
#pragma unroll
            for (int s = 0; s < kOneRoundMerge; ++s)
                if (s < nact) A += as[i][s] * ms[s];
            if (d < HD) emit_out(a, xb, o, head, HD, d, A * inv);
        }
        return;
    }
    // Longer sequences: split maxima and sums first (one load round), then
    // weights, then each dim's sum over splits with its loads independent
    // of one another.
    for (int s = threadIdx.x; s < nact; s += blockDim.x) {
        sm_sm[s] = __ldcg(base + size_t(s) * (HD + 2));
        sm_sl[s] = __ldcg(base + size_t(s) * (HD + 2) + 1);
    }
    __syncthreads();
    M = -INFINITY;
    for (int s = 0; s < nact; ++s) M = fmaxf(M, sm_sm[s]);
    __syncthreads();  // all read sm_sm before it becomes the weights
    for (int s = threadIdx.x; s < nact; s += blockDim.x) sm_sm[s] = __expf(sm_sm[s] - M);
    __syncthreads();
    L = 0.0f;
    for (int s = 0; s < nact; ++s) L += sm_sl[s] * sm_sm[s];
    const float inv = out_scale(a, head, M, L);
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float A = 0.0f;
#pragma unroll 8
        for (int s = 0; s < nact; ++s) A += __ldcg(base + size_t(s) * (HD + 2) + 2 + d) * sm_sm[s];
        emit_out(a, xb, o, head, HD, d, A * inv);
    }
}


// Keys per warp round (KernelPlan::attn_keys, 8, or 4 where a lane's K and
// V rows would not fit 64 registers). (16 keys at head dim 64, what fits,
// ran Qwen2.5-0.5B's tg128 at 1,100 / 651 tok/s after 4,096 / 16,384 tokens
// against 8 keys' 1,202 / 746 on an H200, the same within 1 % after 512:
// removed.)
template <int DPL, class F>
void by_keys(int want, F&& f) {
    if constexpr (8 * DPL <= 32) {
        if (want >= 8) return f.template operator()<8>();
    }
    f.template operator()<4>();
}

}  // namespace

int attention_decode_splits(uint32_t n_ctx) {
    // Enough splits that a full cache gives each block about kMinChunk keys
    // (the grid is fixed when the decode step is captured, so size it for
    // the longest sequence; splits past the current length exit at once).
    const uint32_t n = (n_ctx + kMinChunk - 1) / kMinChunk;
    return int(n < 1 ? 1 : n > kMaxDecodeSplits ? kMaxDecodeSplits : n);
}

size_t attention_decode_scratch_floats(int n_head, int head_dim, int nsplit) {
    return size_t(n_head) * nsplit * (head_dim + 2);
}


size_t attention_decode_counters(int n_head, int nrows) { return size_t(n_head > 0 && nrows > 0 ? n_head * nrows : 0); }

bool attention_decode_fused_takes(int nrows, int n_head, int n_kv, int head_dim) {
    // Up to 16 rows, and any number without GQA. Past it, the paged
    // attention's blocks, which serve a KV head's whole query group, read
    // each key once instead of once per query head. H200, the llama-cuda
    // Bench.Batched_*, ms per step fused / RoPE + paged: Qwen2.5-0.5B (7
    // query heads per KV head) 0.629 / 0.778 at 1 row, 2.64 / 2.74 at 16,
    // 2.98 / 2.88 at 32, 3.76 / 3.63 at 64; Phi-3-mini (no GQA) 1.48 / 1.80
    // at 1, 10.8 / 11.9 at 64.
    constexpr int kMaxRowsWithGqa = 16;
    return attention_head_dim_fast(head_dim) && (nrows <= kMaxRowsWithGqa || n_head == n_kv);
}

int attention_decode_row_splits(uint32_t seq_cap, int n_head, int nrows) {
    // Enough blocks to fill the GPU a few times over: one row alone gets the
    // splits a full cache needs, 64 rows of 14 heads one split each.
    constexpr int kBlocksWanted = 1024;
    const int by_fill = std::max(1, kBlocksWanted / std::max(1, n_head * nrows));
    return std::min(attention_decode_splits(seq_cap), by_fill);
}

void rope_attention_decode(const DecodeAttnArgs& a, cudaStream_t stream) {
    AttnArgs at;
    at.q = a.qkv;
    at.ldq = (a.n_head + 2 * a.n_kv) * a.head_dim;
    at.k_cache = a.k_cache;
    at.v_cache = a.v_cache;
    at.n_head = a.n_head;
    at.n_kv = a.n_kv;
    at.head_dim = a.head_dim;
    at.d_pos0 = a.d_pos0;
    at.ntok = 1;
    at.window = a.window;
    at.scale = a.scale;
    at.out = a.out;
    at.ldo = a.n_head * a.head_dim;
    validate(at);
    if (a.n_rot <= 0 || a.n_rot > a.head_dim || a.n_rot % 2)
        throw ehp::Error(EH_INTERNAL, "rope_attention_decode: bad rotary dimension");
    if ((a.inv_freq || a.sinks || a.q_norm) && !attention_head_dim_fast(a.head_dim))
        throw ehp::Error(EH_INTERNAL, "rope_attention_decode: a RoPE table, sinks or QK-norm need head dim 64/96/128/256");
    if (!a.q_norm != !a.k_norm)
        throw ehp::Error(EH_INTERNAL, "rope_attention_decode: QK-norm needs both q_norm and k_norm");
    if (a.paged) {
        if (!attention_head_dim_fast(a.head_dim) || a.nrows < 1 || !a.d_pos || !a.d_rows || !a.d_table || !a.tables ||
            a.ldqkv < at.ldq || a.ldo < at.ldo || a.out_chunks && a.nrows != 1)
            throw ehp::Error(EH_INTERNAL, "rope_attention_decode: paged rows need head dim 64/96/128/256, positions, "
                                          "store rows, block tables, strides and chunks for one row only");
    } else if (a.nrows != 1) {
        throw ehp::Error(EH_INTERNAL, "rope_attention_decode: several rows need the paged form");
    }
    const bool quant = kv_type_quantized(a.kv_type);
    if (a.kv_type && a.kv_type != EH_TYPE_F16 && (!quant || !a.paged || !attention_head_dim_fast(a.head_dim)))
        throw ehp::Error(EH_INTERNAL, "rope_attention_decode: KV type " + std::to_string(a.kv_type) +
                                          " needs Q8_0 / FP8_E4M3, paged rows and head dim 64/96/128/256");
    int xb = 0;
    if (a.out_chunks) {
        xb = detail::gemv_chunk_bits();
        if (!xb || !attention_head_dim_fast(a.head_dim) || reinterpret_cast<uintptr_t>(a.out_chunks) % 16)
            throw ehp::Error(EH_INTERNAL, "rope_attention_decode: chunk output needs an integer GemvInput, head dim 64/96/128/256 and 16-byte alignment");
    }
    if (!attention_head_dim_fast(a.head_dim)) {
        RopeArgs r;
        r.qkv = a.qkv;
        r.ld = at.ldq;
        r.n_head = a.n_head;
        r.n_kv = a.n_kv;
        r.head_dim = a.head_dim;
        r.n_rot = a.n_rot;
        r.neox = a.neox;
        r.freq_base = a.freq_base;
        r.freq_factors = a.freq_factors;
        r.d_pos0 = a.d_pos0;
        r.ntok = 1;
        r.k_cache = a.k_cache;
        r.v_cache = a.v_cache;
        rope_store_kv(r, stream);
        return attention_generic(at, stream);
    }
    const int nsplit = std::clamp(a.nsplit, 1, kMaxDecodeSplits);
    if (nsplit > 1 && (!a.scratch || !a.counters))
        throw ehp::Error(EH_INTERNAL, "rope_attention_decode: several splits need scratch and counters");
    const KernelPlan& kp = plan();
    const dim3 grid(a.n_head, nsplit, a.nrows);
    by_dpl(a.head_dim, [&]<int DPL>() {
        by_keys<DPL>(kp.attn_keys, [&]<int G>() {
            auto go = [&]<bool Pipe, bool Paged, class C = __half>() {
                launch("rope_attn_decode_kernel", rope_attn_decode_kernel<DPL, G, Pipe, Paged, C>, grid,
                       kDecodeWarps * 32, 0, stream, a, std::max(1, kp.attn_min_chunk), xb, detail::attention_early());
            };
            const bool pipe = kp.attn_pipe;
            if (quant)
                detail::by_kv_quant(a.kv_type, [&]<class C>() {
                    pipe ? go.template operator()<true, true, C>() : go.template operator()<false, true, C>();
                });
            else if (a.paged)
                pipe ? go.template operator()<true, true>() : go.template operator()<false, true>();
            else
                pipe ? go.template operator()<true, false>() : go.template operator()<false, false>();
        });
    });
    EHC_LAUNCHED("rope_attn_decode_kernel");
}

}  // namespace ehcuda
