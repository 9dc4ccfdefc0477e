// The kernel route table (kernel_route.hpp): which kernels run a matmul and
// with what parameters, decided once here for the launchers, the load's log
// and `engine-host inspect --kernels`.
#include "ehcuda/kernel_route.hpp"

#include <algorithm>

#include <engine_host/plugin_abi.hpp>

namespace ehcuda {

// ---- GEMV launch choices

bool int_input_type(uint32_t type) {
    return type == EH_TYPE_MXFP4 || type == EH_TYPE_Q4_0 || type == EH_TYPE_Q4_1 || type == EH_TYPE_Q5_0 ||
           type == EH_TYPE_Q5_1 || type == EH_TYPE_Q8_0 || type == EH_TYPE_Q4_K || type == EH_TYPE_Q5_K ||
           type == EH_TYPE_Q6_K || type == EH_TYPE_Q2_K || type == EH_TYPE_Q3_K || type == EH_TYPE_IQ4_NL ||
           type == EH_TYPE_IQ4_XS;
}

bool mixed_launch_type(uint32_t type) {
    return int_input_type(type) && type != EH_TYPE_MXFP4 && type != EH_TYPE_Q2_K && type != EH_TYPE_Q3_K &&
           type != EH_TYPE_IQ4_NL && type != EH_TYPE_IQ4_XS;
}


namespace {

// Blocks of `smem` dynamic shared bytes that fit one multiprocessor.
int blocks_per_sm(size_t smem) { return std::max(1, int(kSmemPerSm / (smem + 2048))); }

// The fewest warps per multiprocessor the ring kernel may run at: below it
// the warps cannot dot their tiles as fast as the copies land. (Llama-3.1-8B's
// Q6_K ffn_down, 4096 x 14336, fits two 11.5 KB buffers for only 4 warps
// next to its 35 KB input: 36 us a call, 1.3 TB/s, ncu on an H200. The
// one-shot kernel instead, 8 warps, one block per multiprocessor: decode
// 360 -> 370 tok/s, H200, bench -p 512 -n 128 -r 3.)
constexpr int kRingMinWarpsPerSm = 8;

// The ring kernel's warps per block: the most warps per multiprocessor
// (multiples of 4 up to 16, at most 32 per multiprocessor as its ~64
// registers per thread allow; the larger block on a tie: fewer stagings);
// b unchanged where two buffers per warp do not fit kRingMinWarpsPerSm
// warps. Its grid (b.blocks) is what stays resident, which the launch asks
// the occupancy calculator.
void plan_ring(BulkLaunch& b) {
    int best = 0, best_w = 0;
    for (int w = 16; w >= 4; w -= 4) {
        const size_t smem = size_t(b.x_bytes) + size_t(w) * 2 * b.tile_stride;
        if (smem > kBulkMaxSmem) continue;
        const int per_sm = w * std::min(blocks_per_sm(smem), 32 / w);
        if (per_sm > best) best = per_sm, best_w = w;
    }
    if (best < kRingMinWarpsPerSm) return;
    b.ring = true;
    b.warps = best_w;
    b.smem = size_t(b.x_bytes) + size_t(best_w) * 2 * b.tile_stride;
    b.blocks = (b.tiles + best_w - 1) / best_w;
}

// bulk_slices 1 takes Q6_K rows of at least this many inputs: on one H200
// (Bench.DISABLED_GemvBandwidth) Q6_K 3840 x 15360 ran in 26.6 us against
// the one-shot kernel's 44.6, Q4_K at that shape 18.7 against 17.8, and Q6_K
// 3072 x 8192 (Phi-3's ffn_down) 17.0 against 11.4.
constexpr int kSliceRingMinCols = 12288;

}  // namespace

BulkLaunch plan_bulk(const KernelPlan& p, int nsm, const GemvShape& g, int ntok) {
    if (ntok <= 1 && p.bulk_slices)
        if (const BulkLaunch s = plan_bulk_slice_ring(p, nsm, g); s.warps) return s;
    BulkLaunch b;
    size_t max_rb = 0;
    int total_rows = 0;
    for (int s = 0; s < g.nseg; ++s) {
        max_rb = std::max(max_rb, g.row_bytes[s]);
        b.same &= g.type[s] == g.type[0];
        total_rows += g.rows[s];
    }
    if (max_rb == 0 || nsm <= 0) return b;
    // Tiles for ~32 warps on every multiprocessor, each at most the tile
    // cap (at least one row) and 8 rows.
    const int want = std::max(1, (total_rows + 32 * nsm - 1) / (32 * nsm));
    const int cap = int(std::max<size_t>(1, (size_t(p.bulk_tile_kb) << 10) / max_rb));
    b.tr = std::min({want, cap, 8});
    // A token group's tile costs its warp several times a single token's
    // work: tiles for ~8 warps on every multiprocessor.
    if (ntok > 1) b.tr = std::min({std::max(1, total_rows / (8 * nsm)), cap, kBulkGroupMaxRows});
    // (each weight chunk decoded once: a lane holds the decoded chunks of
    // its tile's rows and rows x tokens sums, so at most 4 rows; int16
    // inputs, llama-cuda's: the kernels are not instantiated for int16x2)
    b.once = ntok > 1 && p.bulk_group_once && p.gemv_input == GemvInput::Int16;
    if (b.once) b.tr = std::min(b.tr, kBulkOnceMaxRows);
    for (int s = 0; s < g.nseg; ++s) b.tiles += (g.rows[s] + b.tr - 1) / b.tr;
    b.tile_stride = int((size_t(b.tr) * max_rb + 15 + 15) / 16 * 16);
    const size_t xb = size_t(g.cols / 32) * int_chunk_bytes(p.gemv_input == GemvInput::Int16 ? GemvInput::Int16
                                                                                            : GemvInput::Int16x2);
    b.ntok = std::max(1, ntok);
    b.x_stride = int((xb + 15) / 16 * 16);
    // A token group's lanes 0..7 read the same chunk of tokens 0..7 at
    // once: an odd number of 16-byte units between tokens puts the eight
    // 16-byte reads on distinct banks (an even stride, e.g. 4096 inputs'
    // 10,240 bytes, put all eight on the same ones).
    if (ntok > 1 && (b.x_stride / 16) % 2 == 0) b.x_stride += 16;
    b.x_bytes = b.ntok * b.x_stride;
    // Warps per block: as many as keep every multiprocessor busy (4..16),
    // within the shared memory a block may have. By default 16 for matrices
    // of 4 or more waves of such blocks (their per-block input staging
    // halves: 16384 x 8192 Q4_K with float input, 68 % of copy bandwidth at
    // 16 warps, 51 % at 8), else 8 (H100 tok/s, 16 -> 8: Phi-3 494 -> 534,
    // gpt-oss 453 -> 475; 16-warp blocks left Phi-3's 3,072-row matrices at
    // 1.5 blocks per multiprocessor). bulk_fit2: 8 also where a 16-warp block
    // would sit alone on its multiprocessor and the staged input is at most
    // two warps' tiles (Qwen2.5's tied Q8_0 head, 151936 x 896, 84 -> 91 %
    // of copy bandwidth).
    if (p.bulk_warps == 0) {
        b.warps = (b.tiles + 15) / 16 >= 4 * nsm ? 16 : 8;
        if (b.warps == 16 && p.bulk_fit2 && b.x_bytes <= 2 * b.tile_stride &&
            2 * (size_t(b.x_bytes) + 16 * size_t(b.tile_stride) + 2048) > kSmemPerSm)
            b.warps = 8;
    } else {
        b.warps = p.bulk_warps >= 16 ? 16 : p.bulk_warps >= 8 ? 8 : 4;
    }
    while (b.warps > 4 && ((b.tiles + b.warps - 1) / b.warps < nsm ||
                           size_t(b.x_bytes) + size_t(b.warps) * b.tile_stride > kBulkMaxSmem))
        b.warps /= 2;
    b.smem = size_t(b.x_bytes) + size_t(b.warps) * b.tile_stride;
    if (b.smem > kBulkMaxSmem) {
        b.warps = 0;  // too wide: the register kernel serves it
        return b;
    }
    b.blocks = (b.tiles + b.warps - 1) / b.warps;
    const int waves = (b.blocks + blocks_per_sm(b.smem) * nsm - 1) / (blocks_per_sm(b.smem) * nsm);
    // A token group stages every token's input once per block: its
    // resident grid stages it once per block that stays, not once per tile
    // group, whatever the waves.
    if (p.bulk_ring_waves > 0 && (waves >= p.bulk_ring_waves || b.ntok > 1)) plan_ring(b);
    // (a group's resident grid: narrower blocks rather than multiprocessors
    // left without one)
    while (b.ring && b.ntok > 1 && b.warps > 4 && (b.tiles + b.warps - 1) / b.warps < nsm) {
        b.warps -= 4;
        b.smem = size_t(b.x_bytes) + size_t(b.warps) * 2 * b.tile_stride;
        b.blocks = (b.tiles + b.warps - 1) / b.warps;
    }
    return b;
}

BulkLaunch plan_bulk_slices(const KernelPlan& p, int nsm, const GemvShape& g, int ntok) {
    BulkLaunch b;
    if (ntok < 2 || ntok > kBulkMaxTokens || !p.bulk_group_kslice || !p.bulk_group_once ||
        p.gemv_input != GemvInput::Int16 || g.nseg != 1 || !int_input_type(g.type[0]) || g.type[0] == EH_TYPE_MXFP4 ||
        g.cols <= 0 || g.cols % 256 || g.row_bytes[0] == 0 || g.row_bytes[0] % 16 || nsm <= 0)
        return b;
    // only rows of which a tile holds fewer than two: there a whole-row
    // group tiles one row per warp and stages every token's whole input
    if ((size_t(p.bulk_tile_kb) << 10) / g.row_bytes[0] >= 2) return b;
    const int nch = g.cols / 32;
    const size_t xc = int_chunk_bytes(GemvInput::Int16);
    const BulkLaunch whole = plan_bulk(p, nsm, g, ntok);  // (its x_stride: the scratch's layout)
    // the widest slice (whole K-quant super-blocks, 16-byte rows) whose two
    // input and weight buffers fit
    for (int sl = 64; sl >= 8; sl /= 2) {
        if (nch % sl) continue;
        const size_t sb = row_bytes(g.type[0], int64_t(sl) * 32);
        if (sb == 0 || sb % 16) continue;
        const size_t xbytes = size_t(ntok) * sl * xc;
        const size_t smem = 2 * xbytes + size_t(kBulkSliceWarps) * 2 * kBulkOnceMaxRows * sb;
        if (smem > kBulkMaxSmem) continue;
        b.kslice = sl;
        b.once = true;
        b.ntok = ntok;
        b.tr = kBulkOnceMaxRows;
        b.tiles = (g.rows[0] + b.tr - 1) / b.tr;
        b.warps = kBulkSliceWarps;
        b.blocks = (b.tiles + b.warps - 1) / b.warps;
        b.tile_stride = int(sb);
        b.x_bytes = int(xbytes);
        b.x_stride = whole.x_stride;
        b.smem = smem;
        return b;
    }
    return b;
}

BulkLaunch plan_bulk_slice_ring(const KernelPlan& p, int nsm, const GemvShape& g) {
    BulkLaunch b;
    if (nsm <= 0 || can_implement_slice_ring(p, g, 1)) return b;
    int total = 0;
    size_t sb = 0;  // a slice of the widest row: 1024 inputs, whole blocks of every type taken
    for (int s = 0; s < g.nseg; ++s) {
        total += g.rows[s];
        sb = std::max(sb, row_bytes(g.type[s], 1024));
        b.same &= g.type[s] == g.type[0];
    }
    if (total <= 0 || sb == 0) return b;
    // Under bulk_slices 1, only rows one wave of one-row warps holds (32 a
    // multiprocessor): Gemma 3 27B's ffn_down (5376 rows) at two rows a warp
    // or in two waves decoded slower than the one-shot kernel.
    if (p.bulk_slices == 1 && !p.bulk_slice_rows && total > 32 * nsm) return b;
    const int nch = g.cols / 32, nsl = (nch + 31) / 32;
    b.ntok = 1;
    b.slots = std::min(std::clamp(p.bulk_slice_slots, 1, kBulkSliceMaxSlots), nsl);
    // (a slice lands at its source's offset modulo 16: up to 15 bytes more)
    b.tile_stride = int((sb + 15) / 16 * 16 + 16);
    b.x_stride = b.x_bytes = int((size_t(nch) * int_chunk_bytes(p.gemv_input) + 15) / 16 * 16);
    // Rows per warp: 2 where one row a warp needs more warps than the
    // multiprocessors hold at once (32 each: the kernel's 64 registers a
    // thread), so each slice's input chunk serves two rows.
    b.tr = p.bulk_slice_rows == 1 || p.bulk_slice_rows == 2 ? p.bulk_slice_rows : total > 32 * nsm ? 2 : 1;
    for (int s = 0; s < g.nseg; ++s) b.tiles += (g.rows[s] + b.tr - 1) / b.tr;
    // Warps per block: the fewest waves, then the fewest warps on the
    // busiest multiprocessor, then the wider block (fewer input stagings).
    // (Gemma 3 12B's ffn_down, 3840 x 15360 Q6_K, on 132 SMs: 16 warps,
    // 240 blocks, two a multiprocessor: one wave.)
    int best_waves = 0, best_load = 0;
    for (int w : {16, 8, 4}) {
        if (p.bulk_slice_warps && w != p.bulk_slice_warps) continue;
        const size_t smem = size_t(b.x_bytes) + size_t(w) * size_t(b.slots) * size_t(b.tr) * size_t(b.tile_stride);
        if (smem > kBulkMaxSmem) continue;
        const int blocks = (b.tiles + w - 1) / w;
        const int per_sm = std::min(blocks_per_sm(smem), 32 / w);
        const int waves = (blocks + per_sm * nsm - 1) / (per_sm * nsm);
        const int load = (blocks + nsm - 1) / nsm * w;
        if (b.warps && (waves > best_waves || (waves == best_waves && load >= best_load))) continue;
        b.warps = w;
        b.blocks = blocks;
        b.smem = smem;
        best_waves = waves;
        best_load = load;
    }
    if (b.warps == 0) return BulkLaunch{};
    return b;
}

RegisterLaunch plan_register(const KernelPlan& p, int ntok, const GemvShape& g) {
    RegisterLaunch r;
    int total_rows = 0;
    bool fit4 = true, fit2 = true;
    for (int s = 0; s < g.nseg; ++s) {
        total_rows += g.rows[s];
        fit4 &= g.rows[s] % 4 == 0;
        fit2 &= g.rows[s] % 2 == 0;
    }
    // Several rows per warp only pays for tall single-token products; a
    // warp's rows must not straddle two segments. (Phi-3-mini's 3072-row
    // matrices: one row per warp once the input staging shrank, 465 -> 479
    // tok/s on an H100.)
    if (ntok == 1) {
        if (total_rows >= p.gemv_r4_rows && fit4) r.rows_per_warp = 4;
        else if (total_rows >= p.gemv_r2_rows && fit2) r.rows_per_warp = 2;
    }
    const int groups = (total_rows + r.rows_per_warp - 1) / r.rows_per_warp;
    // Fewer than ~12 row groups per SM -> split K over the block's 4 warps.
    // Single token: the same for a short, long-K matrix (Qwen2.5-0.5B's
    // ffn_down, 896 x 4864: one warp per row walked ~5 dependent chunk loads
    // per lane), each block staging the input for its one row group.
    r.split_k = groups < p.split_groups && g.cols >= 32 * 64 && (ntok > 1 || total_rows <= p.split_rows);
    return r;
}

// ---- what the kernels take

bool matmul_type_supported(uint32_t type) {
    switch (type) {
    case EH_TYPE_F32: case EH_TYPE_F16: case EH_TYPE_BF16: case EH_TYPE_Q4_0: case EH_TYPE_Q4_1:
    case EH_TYPE_Q5_0: case EH_TYPE_Q5_1: case EH_TYPE_Q8_0: case EH_TYPE_Q4_K: case EH_TYPE_Q5_K:
    case EH_TYPE_Q6_K: case EH_TYPE_Q2_K: case EH_TYPE_Q3_K: case EH_TYPE_IQ4_NL: case EH_TYPE_IQ4_XS:
        return true;
    default:
        return false;
    }
}

size_t row_bytes(uint32_t type, int64_t cols) {
    eh_type_traits t = eh_tensor_type_traits(type);
    if (!matmul_type_supported(type) || cols <= 0 || t.block_elems == 0 || cols % t.block_elems)
        return 0;
    return size_t(cols / t.block_elems) * t.block_bytes;
}

bool takes_chunks(const KernelPlan& p, uint32_t type) {
    return p.gemv_input != GemvInput::Float && matmul_type_supported(type) && int_input_type(type);
}

bool attention_head_dim_fast(int hd) { return hd == 64 || hd == 96 || hd == 128 || hd == 256; }

// ---- applicability

Refusal can_implement_bulk(const KernelPlan& p, const DeviceTraits& dev, const GemvShape& g, int ntok) {
    if (ntok < 1 || ntok > kBulkMaxTokens) return {"more tokens than its token groups take"};
    if (!p.gemv_bulk) return {"off in the plan (gemv_bulk)"};
    if (ntok > p.bulk_max_tokens) return {"token groups of this many off in the plan (bulk_max_tokens)"};
    if (p.gemv_input != GemvInput::Int16 && p.gemv_input != GemvInput::Int16x2) return {"input not int16 / int16x2"};
    if (dev.cc_major < 9) return {"needs sm_90 (the bulk copy engine)"};
    for (int s = 0; s < g.nseg; ++s) {
        if (g.type[s] == EH_TYPE_MXFP4) return {"MXFP4 weights"};
        if (!int_input_type(g.type[s])) return {"a weight type without an integer dot product"};
    }
    if (plan_bulk(p, dev.sm_count, g, ntok).warps == 0)
        return {"the staged input and a tile per warp exceed its shared memory"};
    return {};
}

Refusal can_implement_bulk_groups(const KernelPlan& p, const DeviceTraits& dev, const MatmulShape& m) {
    if (m.ntok < 2) return {"one token"};
    if (m.ntok > std::min(kBulkMaxTokens, p.bulk_max_tokens)) return {"more tokens than the plan's token groups (bulk_max_tokens)"};
    if (m.chunk_input) return {"a producer's chunks (one token only)"};
    if (m.rms_norm && !p.bulk_group_norm) return {"a fused RMSNorm (bulk_group_norm off)"};
    if (!m.aligned || m.g.cols <= 0 || m.g.cols % 32) return {"input not in the fast kernels' float4 form"};
    for (int s = 1; s < m.g.nseg; ++s)
        if (m.g.type[s] != m.g.type[0] && !(mixed_launch_type(m.g.type[0]) && mixed_launch_type(m.g.type[s])))
            return {"segments of different types outside the mixed launch"};
    // groups of two at least (a wider group that does not fit is split)
    if (const Refusal r = can_implement_bulk(p, dev, m.g, 2)) return r;
    return {};
}

size_t bulk_group_scratch(const BulkLaunch& b, int ntok, bool norm) {
    return size_t(ntok) * size_t(b.x_stride) + (norm ? size_t(kBulkMaxTokens) * sizeof(float) : 0);
}

Refusal can_implement_slice_ring(const KernelPlan& p, const GemvShape& g, int ntok) {
    if (!p.bulk_slices) return {"off in the plan (bulk_slices)"};
    if (ntok != 1) return {"more than one token"};
    if (p.gemv_input != GemvInput::Int16 && p.gemv_input != GemvInput::Int16x2) return {"input not int16 / int16x2"};
    if (g.nseg < 1 || g.nseg > 3) return {"not 1 to 3 segments"};
    if (g.cols <= 0 || g.cols % 32) return {"columns not whole 32-element chunks"};
    size_t max_rb = 0;
    bool same = true;
    for (int s = 0; s < g.nseg; ++s) {
        if (g.type[s] == EH_TYPE_MXFP4) return {"MXFP4 weights"};
        if (!int_input_type(g.type[s])) return {"a weight type without an integer dot product"};
        if (g.row_bytes[s] == 0 || g.row_bytes[s] != row_bytes(g.type[s], g.cols)) return {"rows not whole blocks"};
        max_rb = std::max(max_rb, g.row_bytes[s]);
        same &= g.type[s] == g.type[0];
    }
    for (int s = 0; s < g.nseg && !same; ++s)
        if (!mixed_launch_type(g.type[s])) return {"segments of different types outside the mixed launch"};
    if (p.bulk_slices == 1 && (g.nseg != 1 || g.type[0] != EH_TYPE_Q6_K || g.cols < kSliceRingMinCols))
        return {"not one Q6_K matrix of 12288+ inputs a row (bulk_slices 1)"};
    if (p.bulk_slices == 1 && (size_t(p.bulk_tile_kb) << 10) / max_rb >= 2)
        return {"rows a tile holds two of (bulk_slices 1: long rows only)"};
    return {};
}

Refusal can_implement_mixed(const KernelPlan& p, const GemvShape& g, int ntok) {
    if (ntok != 1) return {"more than one token"};
    if (p.gemv_input == GemvInput::Float) return {"float input"};
    if (!p.gemv_mixed) return {"off in the plan (gemv_mixed)"};
    for (int s = 0; s < g.nseg; ++s)
        if (!mixed_launch_type(g.type[s])) return {"a type outside the mixed launch (MXFP4, Q2_K, Q3_K, IQ4_NL, IQ4_XS, float)"};
    return {};
}

Refusal can_implement_gemv(const MatmulShape& m) {
    if (!m.aligned) return {"input not in the fast kernels' float4 form"};
    if (m.g.cols <= 0 || m.g.cols % 32) return {"columns not whole 32-element chunks"};
    if (m.rms_norm && m.ntok != 1) return {"a fused RMSNorm of more than one token"};
    if (m.chunk_input) return {};  // one token, the launchers check
    if (m.ntok > kGemvMaxTokens) return {"more tokens than the GEMV's groups take"};
    if (!can_implement_cublas(m)) return {"the prefill workspace takes this many tokens"};
    return {};
}

Refusal can_implement_cublas(const MatmulShape& m) {
    if (m.prefill_min_tokens <= 0) return {"no prefill workspace, or it is off"};
    if (m.ntok < m.prefill_min_tokens || m.ntok < 2) return {"fewer tokens than the workspace's threshold"};
    if (m.rms_norm) return {"a fused RMSNorm"};
    return {};
}

Refusal can_implement_pair(const KernelPlan& p, const GemvShape& gu, const GemvShape* dn) {
    if (p.gemv_input != GemvInput::Int16 && p.gemv_input != GemvInput::Int16x2) return {"input not int16 / int16x2"};
    if (gu.nseg != 2 || (dn && dn->nseg != 1)) return {"not a gate and an up matrix"};
    if (gu.type[0] != gu.type[1]) return {"gate and up of different types"};
    if (!int_input_type(gu.type[0]) || gu.type[0] == EH_TYPE_MXFP4) return {"gate|up of a type without the integer dot product, or MXFP4"};
    if (gu.rows[0] != gu.rows[1] || gu.rows[0] <= 0 || gu.rows[0] % 32) return {"gate and up rows not equal whole warps"};
    if (gu.cols <= 0 || gu.cols % 32) return {"columns not whole 32-element chunks"};
    const size_t rb = row_bytes(gu.type[0], gu.cols);
    if (rb == 0 || gu.row_bytes[0] != rb || gu.row_bytes[1] != rb) return {"gate or up rows not whole blocks"};
    if (!dn) return {};
    if (!int_input_type(dn->type[0]) || dn->type[0] == EH_TYPE_MXFP4) return {"down of a type without the integer dot product, or MXFP4"};
    if (dn->cols != gu.rows[0] || dn->row_bytes[0] == 0 || dn->row_bytes[0] != row_bytes(dn->type[0], dn->cols))
        return {"down does not read gate|up's rows"};
    return {};
}

const char* route_kernel_name(RouteKernel k) {
    switch (k) {
    case RouteKernel::GemvBulk: return "gemv_bulk_kernel";
    case RouteKernel::GemvBulkRing: return "gemv_bulk_ring_kernel";
    case RouteKernel::Gemv: return "gemv_kernel";
    case RouteKernel::GemvMixed: return "gemv_kernel";
    case RouteKernel::Generic: return "gemv_generic_kernel";
    case RouteKernel::Cublas: return "cublas";
    case RouteKernel::Wmma: return "gemm_kernel";
    }
    return "?";
}

// ---- routes

namespace {

// Dynamic shared bytes of a GEMV input staged in `in`'s form (gemv_stage.cuh:
// float chunks padded to 36 floats; integer chunks of int_chunk_bytes).
size_t staged_input_bytes(GemvInput in, int cols) {
    return in == GemvInput::Float ? size_t(cols / 32) * 36 * sizeof(float) : size_t(cols / 32) * int_chunk_bytes(in);
}

GemvShape segment(const GemvShape& g, int s) {
    GemvShape one;
    one.type[0] = g.type[s];
    one.rows[0] = g.rows[s];
    one.row_bytes[0] = g.row_bytes[s];
    one.cols = g.cols;
    return one;
}

int total_rows(const GemvShape& g) {
    int n = 0;
    for (int s = 0; s < g.nseg; ++s) n += g.rows[s];
    return n;
}

// One token, or `reps` token groups of `ntok` from tok0, through the bulk
// kernels when they take them; a group's inputs quantized once when the
// call's scratch holds them.
bool add_bulk(MatmulRoute& r, const KernelPlan& p, const DeviceTraits& dev, const GemvShape& g, int seg0, int tok0,
              int ntok = 1, int reps = 1, size_t token_scratch = 0, bool norm = false) {
    if (can_implement_bulk(p, dev, g, ntok)) return false;
    KernelLaunch k;
    k.bulk = plan_bulk(p, dev.sm_count, g, ntok);
    // (small matrices: each block stages the group's inputs, cheaper than a
    // launch; so also without the scratch)
    k.bulk.prequant = ntok > 1 && g.cols >= p.bulk_group_stage_cols && token_scratch >= bulk_group_scratch(k.bulk, ntok, norm);
    k.kernel = k.bulk.ring ? RouteKernel::GemvBulkRing : RouteKernel::GemvBulk;
    k.seg0 = seg0;
    k.nseg = g.nseg;
    k.tok0 = tok0;
    k.ntok = ntok;
    k.reps = reps;
    k.input = p.gemv_input;
    k.blocks = k.bulk.blocks;
    k.threads = k.bulk.warps * 32;
    k.smem = k.bulk.smem;
    r.launch[size_t(r.n++)] = k;
    return true;
}

// The tokens of m through the bulk kernels' token groups (when
// can_implement_bulk_groups takes them): the widest group that fits their
// shared memory, repeated, then the rest (a last single token as a
// single-token launch).
bool add_bulk_groups(MatmulRoute& r, const KernelPlan& p, const DeviceTraits& dev, const MatmulShape& m) {
    if (can_implement_bulk_groups(p, dev, m)) return false;
    // rows too long for whole-row tiles: one sliced launch of all the
    // tokens where the call's scratch holds their inputs quantized once
    if (const BulkLaunch s = plan_bulk_slices(p, dev.sm_count, m.g, m.ntok);
        s.warps && m.g.cols >= p.bulk_group_stage_cols && m.token_scratch >= bulk_group_scratch(s, m.ntok, m.rms_norm)) {
        KernelLaunch k;
        k.bulk = s;
        k.bulk.prequant = true;
        k.kernel = RouteKernel::GemvBulk;
        k.nseg = 1;
        k.ntok = m.ntok;
        k.input = p.gemv_input;
        k.blocks = s.blocks;
        k.threads = s.warps * 32;
        k.smem = s.smem;
        r.launch[size_t(r.n++)] = k;
        return true;
    }
    int nt = std::min({m.ntok, p.bulk_max_tokens, kBulkMaxTokens});
    while (nt > 2 && can_implement_bulk(p, dev, m.g, nt)) --nt;
    for (int t0 = 0; t0 < m.ntok;) {
        const int n = std::min(nt, m.ntok - t0), reps = (m.ntok - t0) / n;
        add_bulk(r, p, dev, m.g, 0, t0, n, reps, m.token_scratch, m.rms_norm);
        t0 += n * reps;
    }
    return true;
}

// Segments of one type: token groups of 8, 4, 2, 1 (gemv_same_type), a
// single token offered to the bulk kernels first.
void add_same_type(MatmulRoute& r, const KernelPlan& p, const DeviceTraits& dev, const GemvShape& g, int seg0,
                   const MatmulShape& m) {
    for (int t0 = 0; t0 < m.ntok;) {
        const int left = m.ntok - t0;
        const int nt = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
        const int reps = nt == 8 ? left / 8 : 1;
        if (nt == 1 && add_bulk(r, p, dev, g, seg0, t0)) {
            t0 += 1;
            continue;
        }
        KernelLaunch k;
        k.kernel = RouteKernel::Gemv;
        k.seg0 = seg0;
        k.nseg = g.nseg;
        k.tok0 = t0;
        k.ntok = nt;
        k.reps = reps;
        k.reg = plan_register(p, nt, g);
        bool int_in = nt == 1;
        for (int s = 0; s < g.nseg; ++s) int_in &= int_input_type(g.type[s]);
        k.input = int_in ? p.gemv_input : GemvInput::Float;
        const int groups = (total_rows(g) + k.reg.rows_per_warp - 1) / k.reg.rows_per_warp;
        const int per_block = k.reg.split_k ? 1 : kGemvWarps;
        k.blocks = (groups + per_block - 1) / per_block;
        k.threads = kGemvWarps * 32;
        k.smem = m.chunk_input ? 0 : k.input != GemvInput::Float || nt == 1 ? staged_input_bytes(k.input, g.cols) : 0;
        r.launch[size_t(r.n++)] = k;
        t0 += nt * reps;
    }
}

}  // namespace

MatmulRoute route_gemv(const KernelPlan& p, const DeviceTraits& dev, const MatmulShape& m) {
    MatmulRoute r;
    if (add_bulk_groups(r, p, dev, m)) return r;
    const GemvShape& g = m.g;
    bool same = true;
    for (int s = 1; s < g.nseg; ++s) same &= g.type[s] == g.type[0];
    if (same) {
        add_same_type(r, p, dev, g, 0, m);
    } else if (!can_implement_mixed(p, g, m.ntok)) {
        if (!add_bulk(r, p, dev, g, 0, 0)) {
            KernelLaunch k;
            k.kernel = RouteKernel::GemvMixed;
            k.nseg = g.nseg;
            k.input = p.gemv_input;
            k.blocks = (total_rows(g) + kGemvWarps - 1) / kGemvWarps;
            k.threads = kGemvWarps * 32;
            k.smem = m.chunk_input ? 0 : staged_input_bytes(k.input, g.cols);
            r.launch[size_t(r.n++)] = k;
        }
    } else {
        for (int s = 0; s < g.nseg; ++s) add_same_type(r, p, dev, segment(g, s), s, m);
    }
    return r;
}

MatmulRoute route_matmul(const KernelPlan& p, const DeviceTraits& dev, const MatmulShape& m) {
    if (m.chunk_input) return route_gemv(p, dev, m);
    MatmulRoute r;
    if (!m.aligned || m.g.cols <= 0 || m.g.cols % 32 ||
        (m.rms_norm && m.ntok != 1 && can_implement_bulk_groups(p, dev, m))) {
        // gemv_generic.cu: one launch for segments of one type, else one each
        bool same = true;
        for (int s = 1; s < m.g.nseg; ++s) same &= m.g.type[s] == m.g.type[0];
        for (int s = 0; s < (same ? 1 : m.g.nseg); ++s) {
            KernelLaunch k;
            k.kernel = RouteKernel::Generic;
            k.seg0 = same ? 0 : s;
            k.nseg = same ? m.g.nseg : 1;
            k.ntok = m.ntok;
            r.launch[size_t(r.n++)] = k;
        }
        return r;
    }
    if (!can_implement_gemv(m) || !can_implement_bulk_groups(p, dev, m)) return route_gemv(p, dev, m);
    KernelLaunch k;
    k.kernel = can_implement_cublas(m) ? RouteKernel::Wmma : RouteKernel::Cublas;
    k.nseg = m.g.nseg;
    k.ntok = m.ntok;
    r.launch[size_t(r.n++)] = k;
    return r;
}

// ---- text

std::string shape_text(const GemvShape& g) {
    std::string s;
    for (int i = 0; i < g.nseg; ++i)
        s += (i ? " + " : "") + ehp::type_name(g.type[i]) + " " + std::to_string(g.rows[i]) + "x" + std::to_string(g.cols);
    return s;
}

namespace {

std::string launch_text(const KernelLaunch& k, const GemvShape& g) {
    bool same = true;
    for (int s = k.seg0 + 1; s < k.seg0 + k.nseg; ++s) same &= g.type[s] == g.type[k.seg0];
    const std::string in = std::string(", ") + gemv_input_name(k.input) + " input";
    switch (k.kernel) {
    case RouteKernel::GemvBulk:
    case RouteKernel::GemvBulkRing:
        if (k.bulk.slots)
            return std::string(route_kernel_name(k.kernel)) + " (slice ring)" + (same ? "" : " (mixed types)") + ": " +
                   std::to_string(k.bulk.tr) + " rows/warp, " + std::to_string(k.bulk.warps) + " warps/block, " +
                   std::to_string(k.bulk.blocks) + " blocks" + in + ", K in slices of 1024, " +
                   std::to_string(k.bulk.slots) + " in flight a warp";
        return std::string(route_kernel_name(k.kernel)) + (same ? "" : " (mixed types)") + ": " +
               std::to_string(k.bulk.tr) + " rows/tile, " + std::to_string(k.bulk.warps) + " warps/block, " +
               std::to_string(k.bulk.blocks) + (k.bulk.ring ? " blocks at most (resident)" : " blocks") + in +
               (k.bulk.prequant ? ", inputs quantized once" : "") + (k.bulk.once ? ", weights decoded once" : "") +
               (k.bulk.kslice ? ", K in slices of " + std::to_string(k.bulk.kslice * 32) : "");
    case RouteKernel::GemvMixed: return "gemv_kernel (mixed types): 1 row/warp" + in;
    case RouteKernel::Gemv:
        return "gemv_kernel: " + std::to_string(k.reg.rows_per_warp) + " rows/warp" +
               (k.reg.split_k ? ", split-K over 4 warps" : "") + in;
    case RouteKernel::Generic: return "gemv_generic_kernel (input not in the fast kernels' form)";
    case RouteKernel::Cublas: return "cuBLAS GEMM on FP16 weights (the model's mirror, else dequantized slabs)";
    case RouteKernel::Wmma: return "gemm_kernel (tensor-core GEMM on the quantized weights)";
    }
    return "?";
}

std::string tokens_text(const KernelLaunch& k) {
    const std::string n = std::to_string(k.ntok) + (k.ntok == 1 ? " token" : " tokens");
    return k.reps > 1 ? std::to_string(k.reps) + " x " + n + ": " : n + ": ";
}

}  // namespace

std::string describe_route(const KernelPlan&, const MatmulShape& m, const MatmulRoute& r) {
    const GemvShape& g = m.g;
    const std::string from = m.chunk_input ? ", input chunks from the producer" : "";
    const bool many = m.ntok > 1;
    bool whole = true;
    for (const KernelLaunch& k : r) whole &= k.seg0 == 0 && k.nseg == g.nseg;
    std::string s = shape_text(g) + ": ";
    if (whole) {
        for (int i = 0; i < r.n; ++i) {
            const KernelLaunch& k = r.launch[size_t(i)];
            const bool grouped = many && k.kernel != RouteKernel::Cublas && k.kernel != RouteKernel::Wmma &&
                                 k.kernel != RouteKernel::Generic;
            s += (i ? "; " : "") + (grouped ? tokens_text(k) : std::string()) + launch_text(k, g) + from;
        }
        if (many && r.n == 1 && (r.launch[0].kernel == RouteKernel::Cublas || r.launch[0].kernel == RouteKernel::Wmma ||
                                 r.launch[0].kernel == RouteKernel::Generic))
            s += ", " + std::to_string(m.ntok) + " tokens";
        return s;
    }
    s += "one launch per segment:";
    int last = -1;
    for (const KernelLaunch& k : r) {
        if (k.seg0 != last) {
            s += (last >= 0 ? "; " : " ") + shape_text(segment(g, k.seg0)) + ": ";
            last = k.seg0;
        } else {
            s += "; ";
        }
        s += (many ? tokens_text(k) : std::string()) + launch_text(k, g) + from;
    }
    return s;
}

// ---- steps

int step_per_token_max(const KernelPlan& p, bool mirrored) {
    return mirrored ? p.batch_gemv_per_token_mirrored : p.batch_gemv_per_token;
}

StepRoute route_step_matmul(const KernelPlan& p, const DeviceTraits& dev, const GemvShape& g, int ntok, bool mirrored,
                            bool chunk_input) {
    StepRoute s;
    const int per_token = step_per_token_max(p, mirrored);
    MatmulShape m;
    m.g = g;
    m.ntok = ntok;
    m.chunk_input = chunk_input && ntok == 1;
    m.prefill_min_tokens = per_token + 1;
    // (a batched step attaches its workspace, whose activation buffer of
    // at least 16 tokens' FP16 rows holds a group's quantized inputs)
    m.token_scratch = size_t(16) * size_t(g.cols) * 2;
    if (ntok > 1 && ntok <= per_token && can_implement_bulk_groups(p, dev, m)) {
        s.per_token = true;
        m.ntok = 1;
    }
    s.route = route_matmul(p, dev, m);
    return s;
}

namespace {

}  // namespace

std::vector<std::string> route_lines(const KernelPlan& p, const DeviceTraits& dev, const std::vector<MatrixKind>& mats,
                                     int ntok, bool mirrored) {
    std::vector<std::pair<std::string, std::string>> items;
    for (const MatrixKind& mk : mats) {
        if (ntok == 1 && !mk.kernel.empty()) {
            items.emplace_back(mk.kind, shape_text(mk.shape) + ": " + mk.kernel);
            continue;
        }
        const StepRoute s = route_step_matmul(p, dev, mk.shape, ntok, mirrored, mk.chunk_input);
        MatmulShape m;
        m.g = mk.shape;
        m.chunk_input = mk.chunk_input && ntok == 1;
        m.ntok = s.per_token ? 1 : ntok;
        std::string what = describe_route(p, m, s.route);
        if (s.per_token) what = std::to_string(ntok) + " single-token calls (side streams), each " + what;
        items.emplace_back(mk.kind, what);
    }
    return count_kinds(items);
}

std::vector<std::string> plan_log(const KernelPlan& p, const DeviceTraits& dev, const std::vector<MatrixKind>& mats,
                                  const std::vector<std::string>& extra) {
    std::vector<std::string> lines{describe_plan(p, dev)};
    lines.insert(lines.end(), extra.begin(), extra.end());
    for (std::string& l : route_lines(p, dev, mats, 1, false)) lines.push_back(std::move(l));
    return lines;
}

std::vector<std::string> count_kinds(const std::vector<std::pair<std::string, std::string>>& items) {
    std::vector<std::pair<std::string, int>> seen;
    for (const auto& [kind, what] : items) {
        const std::string key = kind + "\n" + what;
        auto it = std::find_if(seen.begin(), seen.end(), [&](const auto& e) { return e.first == key; });
        if (it == seen.end()) seen.emplace_back(key, 1);
        else ++it->second;
    }
    std::vector<std::string> lines;
    for (const auto& [key, n] : seen) {
        const size_t nl = key.find('\n');
        lines.push_back(key.substr(0, nl) + " x" + std::to_string(n) + ": " + key.substr(nl + 1));
    }
    return lines;
}

}  // namespace ehcuda
