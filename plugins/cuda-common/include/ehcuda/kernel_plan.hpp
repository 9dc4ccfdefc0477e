// The kernel plan: every tuning choice of the CUDA kernels, made once per
// model at load from the device and the model's shapes, instead of
// process-wide switches. Host code only (no CUDA), so the choices are tested
// without a GPU.
//
// Who holds it: the plugin's Model owns its KernelPlan. Every ABI call that
// runs kernels for that model (plugin_glue.hpp: kv_init and the batched
// calls) installs it on the calling thread with a PlanScope; the launchers read plan(), the installed plan, or the
// defaults where none is (the kernel unit tests, which install their own to
// try other variants).
//
// Overrides, in order: the load's options_json object "kernels" (keys below,
// each INVALID_ARGUMENT when out of range or unknown), then the environment
// variable EHCUDA_PLAN, the same JSON object, for benchmarks that cannot
// pass options (the only environment knob of the CUDA plugins;
// plugins/cuda-common/README.md lists the keys).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ehcuda {

class Options;

// How single-token GEMV on quantized weights takes its input. Int16 (the
// default): quantized per 32 elements to int16 codes + a scale, integer dot
// products (__dp2a), ~1.5e-5 relative rounding of the chunk's largest value.
// Int8: int8 codes and __dp4a, fewer instructions per weight byte but ~0.4 %
// rounding (tiny-model logits drift past 3 %), for measurements. Float: the
// input in FP32 and weights decoded to float (the slowest, the reference).
// Int16x2: int16 codes plus int8 codes of their rounding residue (in
// 1/256 of a code), a __dp2a per pair of weights and a __dp4a per four,
// ~2^-24 of the chunk's largest value (as fine as its FP32 rounding): for
// models whose discrete choices (MoE routing) must not move, at
// integer-path speed.
enum class GemvInput : int { Float = 0, Int16 = 1, Int8 = 2, Int16x2 = 3 };
const char* gemv_input_name(GemvInput in);
// Bytes of one 32-element chunk of a staged integer input (int8, int16,
// int16x2 codes plus scale, padded to 16 bytes): gemv_stage.cuh's kIntStride.
constexpr size_t int_chunk_bytes(GemvInput in) {
    return in == GemvInput::Int8 ? 48 : in == GemvInput::Int16 ? 80 : in == GemvInput::Int16x2 ? 112 : 0;
}

// What the plan needs of the device (cudaDeviceProp's fields).
struct DeviceTraits {
    int cc_major = 0, cc_minor = 0;
    int sm_count = 0;
};

struct KernelPlan {
    // ---- single-token GEMV (gemv.cu, gemv_bulk.cu)
    GemvInput gemv_input = GemvInput::Int16;
    // sm_90+, int16 / int16x2 input: each warp's rows copied to shared
    // memory by the bulk copy engine (else the register streaming kernel).
    bool gemv_bulk = true;
    int bulk_tile_kb = 8;      // a warp's tile, at most
    int bulk_warps = 0;        // warps per block, 4 / 8 / 16; 0: by the matrix (see plan_bulk)
    bool bulk_fit2 = true;     // 8 warps where a 16-warp block would sit alone on its SM
    // Matrices of this many waves (blocks over what the SMs hold at once)
    // take the resident-grid form; 0: never. 2, not 3: Llama-3.1-8B's and
    // Qwen3-8B's two-wave matrices decode faster resident, and no model
    // measured slower (docs/benchmarks.md, batch 1).
    int bulk_ring_waves = 2;
    // Matmuls of 2 .. this many tokens (at most kBulkMaxTokens) run through
    // the bulk kernels' token groups, each weight read once for the group,
    // instead of one single-token GEMV per token or cuBLAS on FP16 weights;
    // 1: never (the batched step's choice of batch_gemv_per_token below).
    // 3: with the group keys below, groups win up to 3 tokens on both models
    // measured and cuBLAS on FP16 mirrors wins at 4 on the weight-bound one
    // (H200, forged Q4_K_M, bench decode tok/s -p 128, the groups with
    // bulk_group_once, bulk_group_stage_cols 1024 and bulk_group_kslice
    // against groups of two and cuBLAS on mirrors from 3: Qwen2.5-0.5B
    // batch 2 / 4 / 8: 2,224 / 3,564 / 4,684 against 2,097 / 2,771 / 5,446;
    // Llama-3.1-8B batch 2 / 3 / 4 / 8: 490 / 594 / 661 / 890 against
    // 394 / 537 / 710 / 1,333). int16x2 plans keep 2 (choose_plan): their
    // groups decode the weights per token.
    int bulk_max_tokens = 3;
    // Token groups dotted lane = chunk (the single-token order): each lane
    // decodes each weight chunk of its tile once, to byte codes and the
    // chunk's scales, and dots it with every token's staged chunk, instead
    // of one lane per token decoding it again for each (tiles of at most 4
    // rows: the decoded rows and rows x tokens sums stay in registers).
    // int16 inputs only (int16x2 groups keep the per-token form). Measured
    // only with the two keys below on (bulk_max_tokens' numbers).
    bool bulk_group_once = true;
    // Token groups take an RMSNorm in their inputs' quantization (the
    // batched step's QKV, gate|up and LM head: no separate rmsnorm kernel),
    // each token's 1 / rms applied to its sums as the one-token fold does.
    // Off: not measured (its first GPU run had it inert: the route sent
    // multi-token norms to the generic kernel, since fixed).
    bool bulk_group_norm = false;
    // Token groups of fewer inputs than this stage them in each block (and
    // take an RMSNorm there) instead of after a quantize_tokens launch: for
    // small matrices the launch costs more than every block's staging.
    // 0: a launch whenever the call has the scratch. 1024 (Qwen2.5-0.5B's
    // 896 staged, 4864 and Llama's 4096 launched) measured only together
    // with bulk_group_once (bulk_max_tokens' numbers).
    int bulk_group_stage_cols = 1024;
    // Token groups (decoded once) over rows too long for two in a tile
    // (ffn_down of 14336 inputs): one launch for all the group's tokens,
    // each block 32 rows in slices of K, the slice's inputs shared by its
    // warps (plan_bulk_slices), instead of narrower groups each reading the
    // weights and one row per tile. Needs the inputs quantized once.
    // Measured only together with bulk_group_once (Llama-3.1-8B's numbers at
    // bulk_max_tokens).
    bool bulk_group_kslice = true;
    // One-token bulk GEMVs as a ring of K slices per warp
    // (gemv_slice_ring.cu, plan_bulk_slice_ring): each warp keeps its 1 or
    // 2 rows for the whole kernel and streams them in slices of 1024
    // inputs, bulk_slice_slots slices in flight, dotting each as it lands
    // (the FFN pair kernel's bulk form), instead of one copy of a whole
    // tile dotted after it lands. 0: never; 1: a Q6_K matrix of 12288+
    // inputs a row whose rows one wave of one-row warps holds (ffn_down of
    // Gemma 3 12B, Llama-3.1-8B: rows too long for two in a tile take the
    // one-shot kernel's one-row tiles, copy then dot); 2: every one-token
    // matmul the bulk kernels take (slower on short rows and many rows).
    // choose_plan sets 1 on sm_90 (the bulk copy engine's).
    int bulk_slices = 0;
    int bulk_slice_slots = 2;  // slices in flight per warp, 2 .. kBulkSliceMaxSlots
    int bulk_slice_rows = 0;   // rows per warp, 1 or 2; 0: by the matrix (plan_bulk_slice_ring)
    int bulk_slice_warps = 0;  // warps per block, 4 / 8 / 16; 0: by the matrix
    int gemv_r4_rows = 8192;   // register kernel: 4 rows per warp from this many rows
    // 2 rows per warp from this many (4096, not 2048: with the entry
    // prefetch and chunk inputs, one row per warp for Phi-3's 3072-row
    // matrices took its decode 465 -> 479 tok/s on an H100)
    int gemv_r2_rows = 4096;
    // Split K below this many row groups, and for one token up to this many
    // rows. (Split-K for every chunk-input GEMV from 1024 inputs was
    // measured: Qwen 1357 -> 1343, Phi-3 467 -> 470 tok/s on an H100.)
    int split_groups = 1536;
    int split_rows = 2048;
    bool gemv_mixed = true;    // segments of different integer-path types in one launch
    // Each lane asks L2 for its first chunk of each row before the input
    // staging, which then overlaps the first weight fetch (H100: Qwen2.5-0.5B
    // decode 1320 -> 1347, Phi-3 462 -> 465 tok/s).
    bool entry_prefetch = true;
    // Float weights, one row per warp (gpt-oss's F32 router, GPT-2's F16
    // matrices): each lane's first chunk into registers before the PDL wait
    // rather than an L2 request (H100: gpt-oss-20b 480.3 -> 485.4-486.4
    // tok/s, GPT-2 2,441 -> 2,458-2,462).
    bool early_regs = true;
    // ---- dense FFN pair kernel (ffn_decode.cu) and its MoE form
    int pair_rows = 0;   // rows of gate and of up per warp, 2 or 4; 0: by occupancy
    int pair_slots = 2;  // slices in flight per warp in the bulk form; 0: register form
    // ---- decode attention (attention_decode.cu, attention_sink.cu)
    int attn_keys = 8;         // keys per warp round of the fused decode kernel (8, or 4 where 8 do not fit)
    int attn_min_chunk = 64;   // the fewest keys a split of the fused decode kernel takes
    int attn_early = 2;        // cache reads before the PDL wait: 0 none, 1 first key group, 2 also an L2 request
    bool attn_pipe = true;     // a warp's next key group loaded before the current one is scored
    // Decode steps of grouped-query models whose longest row attends at
    // least this many keys: RoPE + K/V store, then attention_decode_group
    // (each key read once per KV head, not once per query head), instead
    // of the fused kernel; -1 never. (H200, Qwen2.5-0.5B tg128 at 16,384
    // keys: 765 tok/s fused, the session path of before with this split
    // 1,227.)
    int attn_group_min_keys = 2048;
    int sink_min_chunk = 128;  // the fewest keys a split of the sink attention takes
    // ---- MoE (gpt-oss)
    bool moe_fused_route = true;  // decode: routing inside the gate|up kernel
    // decode, a router of F32 rows: its own kernel (moe_router_decode, one
    // block per row, the top-k too when not fused), not the GEMV
    bool moe_router_kernel = true;
    // decode, 8 or more experts a token: output rows of a down block (4 or
    // 8; its 8 warps take one expert each)
    int moe_down_rows = 8;
    // grouped tensor-core experts (moe_grouped_mma.cu): passes of 32 tokens
    // instead of 8 when the experts average more than this many tokens. A
    // pass of 8 runs two blocks a multiprocessor (registers), one of 32 one:
    // where the experts hold a few tokens each (a decode step's routing
    // spread over them), the 8-token passes keep more warps in flight
    // (docs/benchmarks.md, MoE under load)
    int moe_wide_pass_tokens = 16;
    // ... and, MXFP4 experts, gate|up passes of 64 tokens (8-warp blocks)
    // past this many (a 512-token prefill pass of gpt-oss-20b averages 64:
    // pp512 on an H200 11,490 -> 12,425; 0, i.e. also in decode steps, took
    // 64 clients through the server from 3,908 to 3,311 tok/s on an H100)
    int moe_long_pass_tokens = 32;
    // MXFP4 gate|up passes of 32 and 64 tokens, one block per multiprocessor
    // (its registers): as many cp.async stages as shared memory holds (6 and
    // 4) instead of 3; Q4_K and Q6_K always take those (H100, gpt-oss-20b, 64
    // clients through the server: 4,027 - 4,076 tok/s against 4,012 - 4,035;
    // pp512 the same)
    bool moe_deep_pipeline = true;
    // grouped experts (moe_grouped): the tile form (moe_grouped_tiles.cu:
    // 128 rows x 128 pairs a block, the weights decoded once per block) when
    // the experts average at least this many tokens; below it the passes
    // above (or the integer form). 0: always; 65536: never
    int moe_tile_pass_tokens = 64;
    // grouped tensor-core MXFP4 experts: tokens a pass takes where the
    // experts average at most moe_wide_pass_tokens (8 or 16; 16 decodes an
    // expert of 9 to 16 tokens, common in a 64-sequence decode step, once
    // instead of twice: 45 passes of 8 or 33 of 16 in such a step)
    int moe_decode_pass_tokens = 16;
    // ---- batched steps (kernel_route.hpp, route_step_matmul)
    // A step's inputs go up on a copy stream while the step before computes
    // (BatchShape::upload_aside); false: on the step's stream, in its time.
    bool step_upload_aside = true;
    // Steps of 2 .. this many tokens run their dense matmuls as one
    // single-token GEMV per token on side streams; more, one cuBLAS GEMM per
    // matrix (the prefill workspace's threshold is this + 1). The multi-token
    // GEMV kernels took 2.7 / 4.2 / 7.3 ms a step (Qwen2.5-0.5B, 2 / 4 / 8
    // tokens) and 14 / 24 / 45 ms (Phi-3) against 1.9 / 2.8 / 4.8 and 4.4 /
    // 6.9 / 12.2 per token (H200, forged Q4_K_M files); cuBLAS on
    // slab-dequantized weights wins from 9 (gpt-oss-20b, 64 sequences: 1,409
    // against 973 tokens/s).
    int batch_gemv_per_token = 8;
    // The same for a model that keeps FP16 weight mirrors (llama-cuda's
    // fp16_weights): cuBLAS reads them as they are, from 3 tokens.
    int batch_gemv_per_token_mirrored = 2;
    // gpt-cuda: the most tokens of a step whose experts run as one grouped
    // call (moe_grouped; a longer step takes calls of this many); below 2
    // never grouped (the cuBLAS grouped form, moe_prefill, when not
    // captured). Bounds the grouped scratch: ~95 KB a token for gpt-oss-20b.
    int batch_moe_grouped_max = 2048;
    // ---- tensor parallelism over GPUs (llama-cuda's ranks on their own
    // streams): an all-reduce of at least this many floats (a prefill
    // step's residual) takes NCCL where it is loaded, smaller ones (decode:
    // n_embd x 1 .. 64 tokens) the one-shot peer kernel (allreduce.hpp),
    // which is one launch and no ring; 0: NCCL for every size.
    int allreduce_nccl_min_floats = 1 << 20;
    // The one-shot all-reduce's barrier across GPUs: flags raised and
    // awaited inside the kernel (allreduce_oneshot_signal: no event edges
    // between the ranks' streams) instead of stream events. Off until
    // measured on a multi-GPU host; ranks sharing a GPU always take events
    // (their kernels must run at once for the flags, which one GPU's queues
    // do not promise).
    bool allreduce_signals = false;
    // ---- launches
    bool pdl = true;          // programmatic dependent launch (only where the device has it)
    // ---- prefill through cuBLAS (prefill_workspace.cpp)
    int prefill_min_tokens = 16;  // 0: never
    int prefill_slab_mb = 0;      // 0: the workspace's default
    int prefill_dense_slab_mb = 0;

    bool operator==(const KernelPlan&) const = default;
};

// The plan a model gets before overrides: device facts (PDL and the bulk
// copy kernels need sm_90) and what the model needs of the GEMV input
// (exact_routing: a model whose discrete choices, MoE top-k routing, must
// not move with the int16 rounding takes int16x2).
KernelPlan choose_plan(const DeviceTraits& dev, bool exact_routing);
// Applies the "kernels" object's keys (INVALID_ARGUMENT naming a bad or
// unknown key).
void apply_plan_options(KernelPlan& p, const Options& kernels);
// Applies EHCUDA_PLAN (the same keys) when set; INVALID_ARGUMENT names it.
void apply_plan_env(KernelPlan& p);
// A load's plan: choose_plan, then the load options' "kernels" object, then
// EHCUDA_PLAN.
KernelPlan load_plan(const DeviceTraits& dev, bool exact_routing, const Options& load_options);
// The keys apply_plan_options takes.
const std::vector<std::string_view>& plan_option_keys();

// ---- the installed plan
const KernelPlan& plan();
class PlanScope {
public:
    explicit PlanScope(const KernelPlan& p);
    ~PlanScope();
    PlanScope(const PlanScope&) = delete;
    PlanScope& operator=(const PlanScope&) = delete;

private:
    const KernelPlan* prev_;
};

// ---- single-token GEMV launch choices (the launchers and the load's log
// use these, so the log says what runs)

// Weight types with an integer-input dot product (quant_dp4a.cuh).
bool int_input_type(uint32_t type);
// The types one launch of segments of different types decodes: the
// integer-path types but MXFP4 and the low-bit ones (Q2_K, Q3_K, IQ4_NL,
// IQ4_XS), whose decoders would raise that kernel's register use for every
// model; a launch with one of those goes segment by segment.
bool mixed_launch_type(uint32_t type);

// One single-token matmul: up to 3 segments sharing the input.
struct GemvShape {
    int nseg = 1;
    uint32_t type[3] = {};
    int rows[3] = {};
    size_t row_bytes[3] = {};
    int cols = 0;
};

// The bulk GEMV's launch (gemv_bulk.cu): rows per tile, tiles, warps per
// block, shared bytes; warps == 0: it does not take this matrix.
struct BulkLaunch {
    int tr = 0, tiles = 0, warps = 0, x_bytes = 0, tile_stride = 0, blocks = 0;
    int ntok = 1;      // tokens per launch: 1, or a token group of 2 .. kBulkMaxTokens
    int x_stride = 0;  // a token group's shared bytes per token's staged input (x_bytes = ntok * x_stride)
    // A token group's inputs quantized once into the call's scratch by
    // quantize_tokens_kernel (launched before each group), which its blocks
    // copy instead of each quantizing the float rows.
    bool prequant = false;
    // A token group dotted lane = chunk, each weight chunk decoded once
    // (KernelPlan::bulk_group_once).
    bool once = false;
    // Chunks of K a block takes at a time (plan_bulk_slices); 0: whole rows.
    int kslice = 0;
    // One token as a ring of K slices per warp (plan_bulk_slice_ring): the
    // slices in flight per warp; 0: not this form. Then tr is a warp's rows,
    // tiles the warps with rows and tile_stride the shared bytes of one
    // row's slice buffer.
    int slots = 0;
    size_t smem = 0;
    bool same = true, ring = false;
};
constexpr size_t kBulkMaxSmem = 200 * 1024;  // dynamic shared bytes the bulk kernels may take
constexpr size_t kSmemPerSm = 228 * 1024;    // sm_90; each block also holds 1 KB of the system's
constexpr int kBulkMaxWarps = 16;
constexpr int kBulkMaxTokens = 8;     // the bulk kernels' largest token group
constexpr int kBulkGroupMaxRows = 8;  // a token group's rows per tile, at most
constexpr int kBulkOnceMaxRows = 4;   // ... when each weight chunk is decoded once (bulk_group_once)
// The bulk launch of this shape (kernel_route.hpp's can_implement_bulk says
// whether the bulk kernels take it at all).
BulkLaunch plan_bulk(const KernelPlan& p, int sm_count, const GemvShape& g, int ntok = 1);
// A token group's sliced launch (bulk_group_kslice): blocks of
// kBulkSliceWarps warps x kBulkOnceMaxRows rows, K in slices of `kslice`
// chunks, double-buffered; warps == 0 where it does not apply (one segment
// of rows too long for two in a tile, whole 16-byte slices, int16 input,
// decoded once).
constexpr int kBulkSliceWarps = 8;
BulkLaunch plan_bulk_slices(const KernelPlan& p, int sm_count, const GemvShape& g, int ntok);
// One token's slice ring (bulk_slices): rows per warp, warps per block,
// slots; warps == 0 where the plan or the shape refuses it
// (kernel_route.hpp's can_implement_slice_ring says why) or its shared
// memory does not fit. plan_bulk takes it for one token where it applies.
constexpr int kBulkSliceMaxSlots = 4;
BulkLaunch plan_bulk_slice_ring(const KernelPlan& p, int sm_count, const GemvShape& g);

// The register GEMV's launch (gemv.cu): rows per warp and split-K.
struct RegisterLaunch {
    int rows_per_warp = 1;
    bool split_k = false;
};
RegisterLaunch plan_register(const KernelPlan& p, int ntok, const GemvShape& g);

// The plan's model-wide line: input form, PDL, FFN pair and the decode
// attention's parameters.
std::string describe_plan(const KernelPlan& p, const DeviceTraits& dev);

// One weight matrix of a model as the load's log names it: its kind
// ("attn_qkv", "ffn_down", ...) and single-token shape, or the line of a
// kernel other than the GEMV that serves it (`kernel`, e.g. the FFN pair).
struct MatrixKind {
    std::string kind;
    GemvShape shape;
    bool chunk_input = false;  // its decode input comes as chunks from the kernel before
    std::string kernel;        // non-empty: this serves it at one token, instead of its matmul route
};
// The load's plan log: describe_plan's line, `extra` (the attention kinds),
// then one line per kind and distinct single-token route (route_lines), in first-seen order, with the
// number of matrices it covers ("ffn_down x24: Q4_K 896x4864: ...").
std::vector<std::string> plan_log(const KernelPlan& p, const DeviceTraits& dev, const std::vector<MatrixKind>& mats,
                                  const std::vector<std::string>& extra);

}  // namespace ehcuda
