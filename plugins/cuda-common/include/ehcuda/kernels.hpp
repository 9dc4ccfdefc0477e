// Host-callable launchers for the shared kernels. All pointers are device
// pointers; all launches go on the given stream and are checked. Activations
// are FP32 row-major [token][feature] with explicit leading dimensions (ld*),
// so fused layouts (one QKV buffer, one gate|up buffer) need no copies.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernel_plan.hpp"
#include "kernel_route.hpp"  // matmul_type_supported, row_bytes, attention_head_dim_fast

namespace ehcuda {

class PrefillWorkspace;  // prefill_workspace.hpp

// A weight matrix as stored: `rows` output features, each a row of `cols`
// input elements in `type` (ggml dims = {cols, rows}).
struct WeightRef {
    const void* data = nullptr;
    uint32_t type = 0;
    int rows = 0;
    int cols = 0;
    size_t row_bytes = 0;
};

// One weight matrix whose outputs land at y[t*ldy + out_offset + r].
struct MatSeg {
    WeightRef w;
    const float* bias = nullptr;  // [rows] or NULL
    int out_offset = 0;
};

enum class XMode : int {
    Plain = 0,
    // x[t][k] = silu(x[t][k]) * x[t][k + cols]: the SwiGLU of a gate|up
    // buffer folded into the load of the down projection's input.
    SwiGLU = 1,
    // x[t] = rmsnorm(x[t]) * norm_w: the pre-norm folded into the matmul
    // (single-token GEMV only; each block normalises its staged copy).
    RmsNorm = 2,
    // x is one token's input already in the single-token integer form of
    // the current GemvInput (gate_up_swiglu's output, gemv_chunk_bytes
    // long), read as is: no staging. Single-token GEMV on the integer-path
    // weight types only, and not with GemvInput::Float.
    Chunks = 3,
};

// y = W x (+ bias) (+ y if accumulate), for up to 3 matrices sharing the
// input (Q, K, V or gate, up) in one launch.
struct MatmulArgs {
    MatSeg seg[3];
    int nseg = 1;
    int cols = 0;           // K: input features (fast kernels: a multiple of 32)
    const float* x = nullptr;
    int ldx = 0;
    XMode xmode = XMode::Plain;
    const float* norm_w = nullptr;  // XMode::RmsNorm
    float norm_eps = 0.0f;
    float* y = nullptr;
    int ldy = 0;
    bool accumulate = false;  // y += W x: the residual add, fused
    int ntok = 1;
    // Prefill scratch (prefill_workspace.hpp). When set and ntok reaches its
    // min_tokens(), the GEMM dequantizes weights slab by slab into FP16 and
    // runs cuBLAS; NULL keeps the WMMA kernel. Decode leaves it NULL.
    PrefillWorkspace* prefill = nullptr;
};

// One token, or up to 8 while the prefill workspace (a.prefill) does not
// take that many (its min_tokens(), from the plan; a batched step whose
// model keeps FP16 weight mirrors lowers it to 3): weight-streaming GEMV,
// each weight byte read once for all tokens. More: tensor-core GEMM that
// dequantizes 64x32 weight tiles into shared memory (FP16 operands, FP32
// accumulation), or with a.prefill set, slab dequantization + cublasGemmEx.
// The single-token kernel and its launch shape come from the installed
// KernelPlan (kernel_plan.hpp: plan_bulk, plan_register): on sm_90 with an
// int16 / int16x2 input, the bulk-copy kernel (each warp's rows copied to
// shared memory by the copy engine; the same dot products summed in the
// same order as the register kernel without its split-K, so bitwise the
// same but for the last bits of the RMSNorm fold's 1/rms factor), else the
// register streaming kernel.
void matmul(const MatmulArgs& a, cudaStream_t stream);
// Whether matmul() runs a's several tokens together as the bulk kernels'
// token groups (kernel_route.hpp, can_implement_bulk_groups): a batched
// step then makes one call, not one per token.
bool matmul_groups_tokens(const MatmulArgs& a);
// The single-token shape of a matmul over these segments (the plan's
// choosers and the load's log take it).
inline GemvShape gemv_shape(const MatSeg* segs, int nseg) {
    GemvShape g;
    g.nseg = nseg;
    for (int s = 0; s < nseg && s < 3; ++s) {
        g.type[s] = segs[s].w.type;
        g.rows[s] = segs[s].w.rows;
        g.row_bytes[s] = segs[s].w.row_bytes;
    }
    g.cols = nseg > 0 ? segs[0].w.cols : 0;
    return g;
}
// The installed plan's GEMV input form (KernelPlan::gemv_input).
GemvInput gemv_input();
// Bytes of n inputs (n % 32 == 0) in the current single-token integer form
// (XMode::Chunks); 0 under GemvInput::Float.
size_t gemv_chunk_bytes(int n);
// Whether a single-token matmul on this weight type can read its input as
// such chunks (XMode::Chunks) under the current GemvInput.
bool gemv_takes_chunks(uint32_t type);

// A decode step's dense gate and up projections with the SwiGLU between
// them and the down projection (llama-family FFN): act[r] = silu(gate_r . x)
// * (up_r . x) (+ biases), x optionally RMS-normalised on the fly (norm_w),
// written to `out` in the current GemvInput integer form, which the down
// projection then reads with XMode::Chunks. One kernel instead of a gate|up
// GEMV whose float output every block of the down GEMV re-read and staged.
// The same dot products, summation order and rounding as that pair, so the
// down projection's result is identical. gate_up_swiglu_supported says when
// it applies: gate and up of one integer-path type, down of an integer-path
// type taking n_ff = gate rows inputs, n_ff and cols multiples of 32,
// GemvInput Int16 or Int16x2.
struct GateUpArgs {
    MatSeg gate, up;  // out_offset unused
    int cols = 0;
    const float* x = nullptr;       // 16-byte aligned
    const float* norm_w = nullptr;  // NULL: x as is
    float norm_eps = 0.0f;
    void* out = nullptr;  // gemv_chunk_bytes(gate.w.rows)
    size_t out_bytes = 0;
};
bool gate_up_swiglu_supported(const WeightRef& gate, const WeightRef& up, const WeightRef& down);
void gate_up_swiglu(const GateUpArgs& a, cudaStream_t stream);
// Warps per multiprocessor gate_up_swiglu's kernel runs at for these gate
// and up weights under the installed plan (its occupancy:
// rows per warp, shared memory and register bound); 0 if not supported.
int gate_up_swiglu_warps_per_sm(const WeightRef& gate, const WeightRef& up);
// The kernel gate_up_swiglu launches for these weights under the installed
// plan and its parameters, for the load's log.
std::string gate_up_swiglu_describe(const WeightRef& gate, const WeightRef& up);
void gemv(const MatmulArgs& a, cudaStream_t stream);
void gemm(const MatmulArgs& a, cudaStream_t stream);
// Shapes the fast kernels do not take: cols not a multiple of 32, an input
// stride or base not 16-byte aligned, fused RMSNorm over several tokens.
// matmul() sends those to matmul_generic, which honours every MatmulArgs
// field for any cols that is whole blocks of each weight type (one warp per
// output row and token; slow, exact FP32 dot products, deterministic).
bool matmul_needs_generic(const MatmulArgs& a);
void matmul_generic(const MatmulArgs& a, cudaStream_t stream);

// out[t] = x[t] / rms(x[t]) * w. With `delta`, first h[t] += delta[t] (the
// residual add, fused) and x is h.
void rmsnorm(const float* x, int ldx, const float* w, float* out, int ldo, int n, int ntok,
             float eps, cudaStream_t stream);
void add_rmsnorm(float* h, const float* delta, const float* w, float* out, int n, int ntok,
                 float eps, cudaStream_t stream);

// out[t] = row tokens[t] of the table, decoded. Token ids must be < rows.
void embed_rows(const WeightRef& table, const int32_t* tokens, int ntok, float* out,
                cudaStream_t stream);

// hist[*d_pos0 + i] = tokens[i]: the context record the repetition penalty
// reads.
void record_tokens(int32_t* hist, const int32_t* d_pos0, const int32_t* tokens, int n,
                   cudaStream_t stream);

// "" when this library's kernels can run on the current device, else why not
// (e.g. no kernel image for its architecture).
std::string check_kernel_image();

// Rotates Q in place and writes rotated K and V into the FP16 cache at
// positions *d_pos0 + t. qkv is [t][q | k | v] with row stride ld.
struct RopeArgs {
    float* qkv = nullptr;
    int ld = 0;
    int n_head = 0, n_kv = 0, head_dim = 0, n_rot = 0;
    bool neox = false;
    float freq_base = 10000.0f;
    const float* freq_factors = nullptr;  // device, n_rot/2 divisors of each pair's frequency (Llama 3 rope_freqs), or null
    const int32_t* d_pos0 = nullptr;
    int ntok = 1;
    __half* k_cache = nullptr;  // [pos][n_kv][head_dim]
    __half* v_cache = nullptr;
    // A batched step (both or neither): token t sits at position d_pos[t]
    // (instead of *d_pos0 + t) and its K/V go to cache row d_rows[t] (a
    // paged pool's row; instead of the position).
    const int32_t* d_pos = nullptr;
    const int32_t* d_rows = nullptr;
    // The cache's element type as PagedAttnArgs::kv_type: a Q8_0 / FP8_E4M3
    // pool gets its rows quantized (kv_quant_store.cu; K rotated in shared
    // memory, Q in place as ever; head dims multiples of 32).
    uint32_t kv_type = 0;
};
void rope_store_kv(const RopeArgs& a, cudaStream_t stream);
// rope_store_kv's quantized form (it dispatches there by kv_type).
void rope_store_kv_quant(const RopeArgs& a, cudaStream_t stream);

// dst[i] = src[d_idx[i]] (rows of `cols` floats; src stride ld, dst dense).
void gather_rows(const float* src, int ld, const int32_t* d_idx, int n, int cols, float* dst, cudaStream_t stream);
// dst[d_pairs[2i]] = src[d_pairs[2i + 1]] for i < n: a chained step's tokens
// taken from the sampled ids of the step before it, on the device. A pair
// whose first index is negative copies nothing (a graph's fixed row count).
void copy_tokens(const int32_t* src, const int32_t* d_pairs, int n, int32_t* dst, cudaStream_t stream);

// Qwen3's QK-norm, in place: each of the n_head Q heads and n_kv K heads of
// every token's [q | k | v] row (stride ld) is RMS-normalised over head_dim
// and scaled by q_norm / k_norm (device, head_dim floats each).
void head_rmsnorm(float* qkv, int ld, int n_head, int n_kv, int head_dim, const float* q_norm,
                  const float* k_norm, int ntok, float eps, cudaStream_t stream);

// Causal GQA attention of ntok queries at positions *d_pos0 + t over the
// cache. window > 0 limits each query to the last `window` positions.
// Head dims 64, 96, 128 and 256 take the tiled kernels below; any other up
// to kAttentionMaxHeadDim takes a simple one-warp-per-(query, head) kernel
// (attention_generic.cu).
struct AttnArgs {
    const float* q = nullptr;
    int ldq = 0;
    const __half* k_cache = nullptr;
    const __half* v_cache = nullptr;
    int n_head = 0, n_kv = 0, head_dim = 0;
    const int32_t* d_pos0 = nullptr;
    int ntok = 1;
    int window = 0;
    float scale = 1.0f;
    float* out = nullptr;
    int ldo = 0;
    // Prefill only (attention_prefill_takes): an FP32 cache instead of
    // k_cache / v_cache, and per-head sink logits (gpt-oss).
    const float* k_cache32 = nullptr;
    const float* v_cache32 = nullptr;
    const float* sinks = nullptr;
    // Prefill on the tensor cores only (attention_prefill_mma_takes): the
    // caches are a batched step's paged pools and the queries one sequence's
    // chunk; key p's row is kv_table[p / kPagedBlockTokens] *
    // kPagedBlockTokens + p % kPagedBlockTokens (attention_paged.hpp).
    const int32_t* kv_table = nullptr;
    // With kv_table: the pools' element type as PagedAttnArgs::kv_type
    // (k_cache / v_cache then point at a quantized pool's bytes).
    uint32_t kv_type = 0;
};
constexpr int kAttentionMaxHeadDim = 256;
// 1 .. kAttentionMaxHeadDim.
bool attention_head_dim_supported(int head_dim);
// The dims the tiled prefill / split-K decode kernels take:
// attention_head_dim_fast (kernel_route.hpp).
// The generic kernels (any supported head dim); attention_prefill/decode
// dispatch to them for dims that are not fast. Decode needs no scratch.
void attention_generic(const AttnArgs& a, cudaStream_t stream);
// Prefill: tensor cores for head dims 64/96/128, without key-range splits
// (attention_prefill.hpp has the form with split scratch and the details).
void attention_prefill(const AttnArgs& a, cudaStream_t stream);
// Whether attention_prefill takes a's FP32 cache or sinks (the tiled kernel
// only: head dims 64, 96, 128, and 256 with an FP16 cache).
bool attention_prefill_takes(const AttnArgs& a);
// Split-K over the KV length for one query token, then an ordered merge.
// Split count for a cache of n_ctx positions (about 64 keys per split when
// full, at most 128).
int attention_decode_splits(uint32_t n_ctx);
size_t attention_decode_scratch_floats(int n_head, int head_dim, int nsplit);
void attention_decode(const AttnArgs& a, float* scratch, int nsplit, cudaStream_t stream);

// A decode step's attention for one token in one launch (instead of
// rope_store_kv + attention_decode's two kernels): each block rotates its
// head's Q itself (qkv is not written), the blocks of the split holding
// position *d_pos0 rotate the token's K, one block per KV head stores K and
// V into the cache there, and those blocks attend the new key from shared
// memory rather than from the cache being written. The split that finishes
// last for a head (a per-head counter, returned to 0 by that block, so a
// captured graph replays) merges all splits in split order: bitwise
// reproducible. Head dims that are not attention_head_dim_fast take
// rope_store_kv (which rotates Q in qkv) + attention_generic.
struct DecodeAttnArgs {
    float* qkv = nullptr;  // the token's [q | k | v], unstrided
    int n_head = 0, n_kv = 0, head_dim = 0, n_rot = 0;
    bool neox = false;
    float freq_base = 10000.0f;
    const float* freq_factors = nullptr;  // as RopeArgs::freq_factors
    const int32_t* d_pos0 = nullptr;
    __half* k_cache = nullptr;  // [pos][n_kv][head_dim]
    __half* v_cache = nullptr;
    int window = 0;
    float scale = 1.0f;
    float* out = nullptr;  // [n_head][head_dim]
    int nsplit = 1;        // attention_decode_splits(n_ctx)
    float* scratch = nullptr;      // attention_decode_scratch_floats(n_head, head_dim, nsplit)
    uint32_t* counters = nullptr;  // attention_decode_counters(n_head), zeroed once before the first launch
    // Optional: `out` also as the integer chunks a single-token GEMV reads
    // with XMode::Chunks (gemv_chunk_bytes(n_head * head_dim) bytes,
    // 16-byte aligned; the attention output projection then stages nothing).
    // Needs an integer GemvInput and a head dim attention_head_dim_fast takes.
    void* out_chunks = nullptr;
    // Paged: the decode rows of a batched step, one token of a different
    // sequence each, instead of the one token above. Row r's [q | k | v] is
    // at qkv + r * ldqkv, at position d_pos[r]; its K and V go to pool row
    // d_rows[r] of k_cache / v_cache (pools of kPagedBlockTokens-position
    // blocks, attention_paged.hpp); its keys are read through the block ids
    // at tables + d_table[r]; its output is at out + r * ldo. Scratch and
    // counters hold nrows times a row's (attention_decode_scratch_floats(
    // nrows * n_head, ..), attention_decode_counters(n_head, nrows)). Head
    // dims attention_head_dim_fast takes; out_chunks with one row only.
    bool paged = false;
    int nrows = 1;
    int ldqkv = 0, ldo = 0;
    const int32_t* d_pos = nullptr;
    const int32_t* d_rows = nullptr;
    const int32_t* d_table = nullptr;
    const int32_t* tables = nullptr;
    // gpt-oss: RoPE from a frequency table (n_rot / 2 entries, device) with
    // cos and sin scaled by attn_factor, as RopeTableArgs (gpt_ops.hpp),
    // instead of freq_base / freq_factors; per-head sink logits (device,
    // n_head) that join each head's softmax denominator.
    const float* inv_freq = nullptr;
    float attn_factor = 1.0f;
    const float* sinks = nullptr;
    // Qwen3's QK-norm: each query head and the new key's head are RMS-
    // normalised (eps norm_eps) and scaled by q_norm / k_norm (device,
    // head_dim floats each) before the rotation, as head_rmsnorm would do
    // in a launch of its own (the same bits). Both or neither.
    const float* q_norm = nullptr;
    const float* k_norm = nullptr;
    float norm_eps = 0.0f;
    // Paged rows only: the pool's element type as PagedAttnArgs::kv_type
    // (k_cache / v_cache then point at a quantized pool's bytes; the new K
    // and V are quantized as rope_store_kv_quant does).
    uint32_t kv_type = 0;
};
size_t attention_decode_counters(int n_head, int nrows = 1);
// Splits for a paged launch of nrows rows whose sequences hold at most
// seq_cap positions: fewer as the rows alone fill the GPU.
int attention_decode_row_splits(uint32_t seq_cap, int n_head, int nrows);
// Whether a batched step's nrows decode rows take the paged
// rope_attention_decode (one launch per layer) rather than RoPE + store and
// attention_paged (attention_paged.hpp).
bool attention_decode_fused_takes(int nrows, int n_head, int n_kv, int head_dim);
void rope_attention_decode(const DecodeAttnArgs& a, cudaStream_t stream);
// How the decode attention kernels read the cache (KernelPlan::attn_early,
// attn_pipe, attn_keys, attn_min_chunk; the results are the same bits
// either way) comes from the installed plan.

// Busy-waits on the GPU for `us` microseconds. Profiling only: queued ahead
// of eagerly launched work so that work then runs back to back, as in a
// graph, and events between kernel groups time the GPU rather than launches.
void gpu_busy_wait(uint32_t us, cudaStream_t stream);

}  // namespace ehcuda
