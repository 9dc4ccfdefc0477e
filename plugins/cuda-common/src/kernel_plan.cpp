#include "ehcuda/kernel_plan.hpp"

#include <algorithm>
#include <cstdlib>

#include <engine_host/plugin_abi.hpp>

#include "ehcuda/options.hpp"

namespace ehcuda {

const char* gemv_input_name(GemvInput in) {
    switch (in) {
    case GemvInput::Float: return "float";
    case GemvInput::Int16: return "int16";
    case GemvInput::Int8: return "int8";
    case GemvInput::Int16x2: return "int16x2";
    }
    return "?";
}

KernelPlan choose_plan(const DeviceTraits& dev, bool exact_routing) {
    KernelPlan p;
    // gpt-oss's top-4 routing flips on near-ties at the int16 rounding of
    // the GEMV input (teacher-forced top-1 against the CPU reference fell
    // from 128/128 to 126/128 on the forged 20B); int16x2 keeps the integer
    // path's speed (the FP32 path read Q8_0 attention weights at ~860 GB/s
    // on an H100).
    if (exact_routing) p.gemv_input = GemvInput::Int16x2;
    // Programmatic dependent launch and the bulk copy engine are sm_90's.
    p.pdl = dev.cc_major >= 9;
    p.gemv_bulk = dev.cc_major >= 9;
    return p;
}

namespace {

constexpr int kBig = 1 << 30;

// One row per key: its name, and how it is read and applied.
struct Key {
    std::string_view name;
    void (*apply)(KernelPlan&, const Options&, std::string_view);
};

#define EHCUDA_INT_KEY(field, lo, hi)                                                             \
    Key{#field, [](KernelPlan& p, const Options& o, std::string_view k) {                        \
            p.field = int(o.integer(k, p.field, lo, hi));                                         \
        }}
#define EHCUDA_BOOL_KEY(field) \
    Key{#field, [](KernelPlan& p, const Options& o, std::string_view k) { p.field = o.boolean(k, p.field); }}

const std::vector<Key>& keys() {
    static const std::vector<Key> k = {
        Key{"gemv_input",
            [](KernelPlan& p, const Options& o, std::string_view k) {
                p.gemv_input = GemvInput(o.choice(k, int(p.gemv_input), {"float", "int16", "int8", "int16x2"}));
            }},
        EHCUDA_BOOL_KEY(gemv_bulk),
        EHCUDA_INT_KEY(bulk_tile_kb, 1, 48),
        Key{"bulk_warps",
            [](KernelPlan& p, const Options& o, std::string_view k) {
                const int v = int(o.integer(k, p.bulk_warps, 0, kBulkMaxWarps));
                if (v != 0 && v != 4 && v != 8 && v != 16)
                    throw ehp::Error(EH_INVALID_ARGUMENT, o.where() + ": \"bulk_warps\" must be 0, 4, 8 or 16");
                p.bulk_warps = v;
            }},
        EHCUDA_BOOL_KEY(bulk_fit2),
        EHCUDA_INT_KEY(bulk_ring_waves, 0, kBig),
        EHCUDA_INT_KEY(gemv_r4_rows, 1, kBig),
        EHCUDA_INT_KEY(gemv_r2_rows, 1, kBig),
        EHCUDA_INT_KEY(split_groups, 0, kBig),
        EHCUDA_INT_KEY(split_rows, 0, kBig),
        EHCUDA_BOOL_KEY(gemv_mixed),
        EHCUDA_BOOL_KEY(entry_prefetch),
        EHCUDA_BOOL_KEY(early_regs),
        Key{"pair_rows",
            [](KernelPlan& p, const Options& o, std::string_view k) {
                const int v = int(o.integer(k, p.pair_rows, 0, 4));
                if (v == 1 || v == 3)
                    throw ehp::Error(EH_INVALID_ARGUMENT, o.where() + ": \"pair_rows\" must be 0, 2 or 4");
                p.pair_rows = v;
            }},
        EHCUDA_INT_KEY(pair_slots, 0, 4),
        Key{"attn_keys",
            [](KernelPlan& p, const Options& o, std::string_view k) {
                const int v = int(o.integer(k, p.attn_keys, 4, 8));
                if (v != 4 && v != 8) throw ehp::Error(EH_INVALID_ARGUMENT, o.where() + ": \"attn_keys\" must be 4 or 8");
                p.attn_keys = v;
            }},
        EHCUDA_INT_KEY(attn_min_chunk, 1, kBig),
        EHCUDA_INT_KEY(attn_early, 0, 2),
        EHCUDA_BOOL_KEY(attn_pipe),
        EHCUDA_INT_KEY(sink_min_chunk, 1, kBig),
        EHCUDA_BOOL_KEY(moe_fused_route),
        EHCUDA_BOOL_KEY(moe_router_kernel),
        Key{"moe_down_rows",
            [](KernelPlan& p, const Options& o, std::string_view k) {
                const int v = int(o.integer(k, p.moe_down_rows, 4, 8));
                if (v != 4 && v != 8) throw ehp::Error(EH_INVALID_ARGUMENT, o.where() + ": \"moe_down_rows\" must be 4 or 8");
                p.moe_down_rows = v;
            }},
        EHCUDA_INT_KEY(moe_wide_pass_tokens, 0, 65536),
        EHCUDA_INT_KEY(moe_long_pass_tokens, 0, 65536),
        EHCUDA_BOOL_KEY(moe_deep_pipeline),
        EHCUDA_INT_KEY(batch_gemv_per_token, -1, 65536),
        EHCUDA_INT_KEY(batch_moe_grouped_max, -1, 65536),
        EHCUDA_BOOL_KEY(pdl),
        EHCUDA_INT_KEY(prefill_min_tokens, 0, kBig),
        EHCUDA_INT_KEY(prefill_slab_mb, 0, 4096),
        EHCUDA_INT_KEY(prefill_dense_slab_mb, 0, 4096),
    };
    return k;
}

#undef EHCUDA_INT_KEY
#undef EHCUDA_BOOL_KEY

}  // namespace

const std::vector<std::string_view>& plan_option_keys() {
    static const std::vector<std::string_view> names = [] {
        std::vector<std::string_view> n;
        for (const Key& k : keys()) n.push_back(k.name);
        return n;
    }();
    return names;
}

void apply_plan_options(KernelPlan& p, const Options& o) {
    o.check_known(plan_option_keys());
    for (const Key& k : keys())
        if (o.has(k.name)) k.apply(p, o, k.name);
}

void apply_plan_env(KernelPlan& p) {
    const char* e = std::getenv("EHCUDA_PLAN");
    if (!e || !*e) return;
    apply_plan_options(p, Options(e, "EHCUDA_PLAN"));
}

KernelPlan load_plan(const DeviceTraits& dev, bool exact_routing, const Options& load_options) {
    KernelPlan p = choose_plan(dev, exact_routing);
    apply_plan_options(p, load_options.object("kernels"));
    apply_plan_env(p);
    return p;
}

// ---- the installed plan

namespace {
const KernelPlan kDefaultPlan{};
thread_local const KernelPlan* t_plan = nullptr;
}  // namespace

const KernelPlan& plan() { return t_plan ? *t_plan : kDefaultPlan; }
PlanScope::PlanScope(const KernelPlan& p) : prev_(t_plan) { t_plan = &p; }
PlanScope::~PlanScope() { t_plan = prev_; }

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

bool bulk_takes(const KernelPlan& p, const DeviceTraits& dev, const GemvShape& g) {
    if (!p.gemv_bulk || (p.gemv_input != GemvInput::Int16 && p.gemv_input != GemvInput::Int16x2) || dev.cc_major < 9)
        return false;
    for (int s = 0; s < g.nseg; ++s)
        if (!int_input_type(g.type[s]) || g.type[s] == EH_TYPE_MXFP4) return false;
    return true;
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

}  // namespace

BulkLaunch plan_bulk(const KernelPlan& p, int nsm, const GemvShape& g) {
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
    for (int s = 0; s < g.nseg; ++s) b.tiles += (g.rows[s] + b.tr - 1) / b.tr;
    b.tile_stride = int((size_t(b.tr) * max_rb + 15 + 15) / 16 * 16);
    const size_t xb = size_t(g.cols / 32) * int_chunk_bytes(p.gemv_input == GemvInput::Int16 ? GemvInput::Int16
                                                                                            : GemvInput::Int16x2);
    b.x_bytes = int((xb + 15) / 16 * 16);
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
    if (p.bulk_ring_waves > 0 && waves >= p.bulk_ring_waves) plan_ring(b);
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

namespace {

std::string shape_text(const GemvShape& g) {
    std::string s;
    for (int i = 0; i < g.nseg; ++i)
        s += (i ? " + " : "") + ehp::type_name(g.type[i]) + " " + std::to_string(g.rows[i]) + "x" + std::to_string(g.cols);
    return s;
}

std::string bulk_text(const KernelPlan& p, const BulkLaunch& b) {
    return std::string(b.ring ? "gemv_bulk_ring_kernel" : "gemv_bulk_kernel") + (b.same ? "" : " (mixed types)") + ": " +
           std::to_string(b.tr) + " rows/tile, " + std::to_string(b.warps) + " warps/block, " +
           std::to_string(b.blocks) + (b.ring ? " blocks at most (resident)" : " blocks") + ", " +
           gemv_input_name(p.gemv_input) + " input";
}

}  // namespace

std::string describe_gemv(const KernelPlan& p, const DeviceTraits& dev, const GemvShape& g, bool chunk_input) {
    const std::string head = shape_text(g) + ": ";
    bool same = true, all_int = true, all_mixed = true;
    for (int s = 0; s < g.nseg; ++s) {
        same &= g.type[s] == g.type[0];
        all_int &= int_input_type(g.type[s]);
        all_mixed &= mixed_launch_type(g.type[s]);
    }
    const bool int_in = all_int && p.gemv_input != GemvInput::Float;
    const std::string from = chunk_input ? ", input chunks from the producer" : "";
    if (same || (int_in && p.gemv_mixed && all_mixed)) {
        if (bulk_takes(p, dev, g)) {
            const BulkLaunch b = plan_bulk(p, dev.sm_count, g);
            if (b.warps > 0) return head + bulk_text(p, b) + from;
        }
        if (!same) return head + "gemv_kernel (mixed types): 1 row/warp, " + gemv_input_name(p.gemv_input) + " input" + from;
        const RegisterLaunch r = plan_register(p, 1, g);
        return head + "gemv_kernel: " + std::to_string(r.rows_per_warp) + " rows/warp" +
               (r.split_k ? ", split-K over 4 warps" : "") + ", " +
               gemv_input_name(int_in ? p.gemv_input : GemvInput::Float) + " input" + from;
    }
    std::string s = head + "one launch per segment:";
    for (int i = 0; i < g.nseg; ++i) {
        GemvShape one;
        one.type[0] = g.type[i];
        one.rows[0] = g.rows[i];
        one.row_bytes[0] = g.row_bytes[i];
        one.cols = g.cols;
        const std::string d = describe_gemv(p, dev, one, chunk_input);
        s += (i ? "; " : " ") + d;
    }
    return s;
}

std::string describe_plan(const KernelPlan& p, const DeviceTraits& dev) {
    const bool pdl = p.pdl && dev.cc_major >= 9;
    std::string s = "kernel plan: sm_" + std::to_string(dev.cc_major) + std::to_string(dev.cc_minor) + ", " +
                    std::to_string(dev.sm_count) + " SMs; GEMV input " + gemv_input_name(p.gemv_input) +
                    (p.gemv_bulk && dev.cc_major >= 9 ? ", bulk copy GEMV" : ", register GEMV") +
                    (pdl ? ", PDL" : ", no PDL") +
                    "; decode attention " + std::to_string(p.attn_keys) + " keys/warp round, splits of >= " +
                    std::to_string(p.attn_min_chunk) + " keys (sinks: " + std::to_string(p.sink_min_chunk) + ")" +
                    ", early reads " +
                    std::to_string(p.attn_early) + (p.attn_pipe ? ", pipelined" : "") +
                    "; FFN pair " +
                    (p.pair_rows ? std::to_string(p.pair_rows) + " rows/warp" : std::string("rows/warp by occupancy")) +
                    ", " + std::to_string(p.pair_slots) + " slices in flight; prefill cuBLAS from " +
                    std::to_string(p.prefill_min_tokens) + " tokens";
    return s;
}

std::vector<std::string> plan_log(const KernelPlan& p, const DeviceTraits& dev, const std::vector<MatrixKind>& mats,
                                  const std::vector<std::string>& extra) {
    std::vector<std::string> lines{describe_plan(p, dev)};
    lines.insert(lines.end(), extra.begin(), extra.end());
    std::vector<std::pair<std::string, int>> seen;  // "kind: launch", matrices
    for (const MatrixKind& m : mats) {
        const std::string what =
            m.kernel.empty() ? describe_gemv(p, dev, m.shape, m.chunk_input) : shape_text(m.shape) + ": " + m.kernel;
        const std::string key = m.kind + "\n" + what;
        auto it = std::find_if(seen.begin(), seen.end(), [&](const auto& e) { return e.first == key; });
        if (it == seen.end()) seen.emplace_back(key, 1);
        else ++it->second;
    }
    for (const auto& [key, n] : seen) {
        const size_t nl = key.find('\n');
        lines.push_back(key.substr(0, nl) + " x" + std::to_string(n) + ": " + key.substr(nl + 1));
    }
    return lines;
}

}  // namespace ehcuda
