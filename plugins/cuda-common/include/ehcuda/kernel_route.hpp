// The kernel route table: one function from (plan, device, a matmul's shape
// and token count) to the kernels that run it and their parameters. The
// launchers (gemv.cu, gemv_bulk.cu) launch what route_matmul says, the
// load's log and `engine-host inspect --kernels` print the same routes, and
// a GPU test (tests/cuda/route_launch_test.cpp) checks every launch against
// its route. Host code only (no CUDA): it is part of eh_cuda_plan, which the
// host links.
//
// Each kernel's applicability is one can_implement_* predicate that says why
// it does not take a shape (in the spirit of CUTLASS's can_implement); the
// router tries the kernels in order of preference.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ehcuda/kernel_plan.hpp"

namespace ehcuda {

// Why a kernel does not take a shape (a static string), or none: it does.
struct Refusal {
    const char* why = nullptr;
    explicit operator bool() const { return why != nullptr; }
};

// The most tokens one matmul call runs through the weight-streaming GEMV
// (token groups of 8, 4, 2 and 1, each reading the weights once); more take
// the GEMM.
constexpr int kGemvMaxTokens = 8;
// The GEMV kernels' block (gemv_kernel, its mixed-type form): 4 warps.
constexpr int kGemvWarps = 4;

// One matmul call as the launchers see it.
struct MatmulShape {
    GemvShape g;
    int ntok = 1;
    bool chunk_input = false;    // XMode::Chunks: a producer's integer chunks (one token)
    bool rms_norm = false;       // XMode::RmsNorm: the norm folded into the input staging (one token; groups: bulk_group_norm)
    bool aligned = true;         // x and ldx in the fast kernels' float4 form (else the generic kernel)
    int prefill_min_tokens = 0;  // the attached prefill workspace's threshold; 0: none attached or off
    // Bytes of device scratch the call has for a token group's inputs
    // quantized once (the attached workspace's activation buffer); 0: none,
    // each block of a group quantizes the float inputs itself.
    size_t token_scratch = 0;
};

enum class RouteKernel : uint8_t {
    GemvBulk,      // gemv_bulk_kernel: bulk-copied tiles, one token
    GemvBulkRing,  // gemv_bulk_ring_kernel: its resident-grid form
    Gemv,          // gemv_kernel: register streaming, token groups of 8/4/2/1
    GemvMixed,     // gemv_kernel over segments of different types, one token
    Generic,       // gemv_generic_kernel: inputs not in the fast kernels' form
    Cublas,        // cuBLAS on FP16 weights (mirrors or slab-dequantized) through the prefill workspace
    Wmma,          // gemm_kernel: the tensor-core GEMM on the quantized weights
};
// The kernel's name as launches record it ("gemv_bulk_kernel", ...).
const char* route_kernel_name(RouteKernel k);

// One kernel launch of a route (or `reps` launches of it over successive
// token groups of `ntok` tokens from tok0).
struct KernelLaunch {
    RouteKernel kernel = RouteKernel::Gemv;
    int seg0 = 0, nseg = 1;  // the segments it multiplies
    int tok0 = 0, ntok = 1;  // its first token and tokens per launch
    int reps = 1;
    GemvInput input = GemvInput::Float;  // the input form of its dot products
    BulkLaunch bulk;                     // GemvBulk, GemvBulkRing
    RegisterLaunch reg;                  // Gemv (GemvMixed: one row per warp, no split)
    // Its launch: grid blocks (GemvBulkRing: at most, the occupancy decides),
    // threads per block and dynamic shared bytes; 0 where the kernel's own
    // launcher sizes it (Generic, Cublas, Wmma).
    int blocks = 0, threads = 0;
    size_t smem = 0;
};

struct MatmulRoute {
    int n = 0;  // launches used
    std::array<KernelLaunch, 12> launch{};
    const KernelLaunch* begin() const { return launch.data(); }
    const KernelLaunch* end() const { return launch.data() + n; }
};

// ---- what the kernels take
// Types the matmul kernels decode in-kernel.
bool matmul_type_supported(uint32_t type);
// Bytes of one row of `cols` elements; 0 if cols is not a whole number of
// blocks (or the type is unsupported).
size_t row_bytes(uint32_t type, int64_t cols);
// Whether a single-token matmul on this type can read its input as a
// producer's integer chunks (XMode::Chunks) under the plan's input form.
bool takes_chunks(const KernelPlan& p, uint32_t type);
// The head dims the tiled prefill / split-K decode attention kernels take.
bool attention_head_dim_fast(int head_dim);

// ---- applicability, one predicate per kernel
// The bulk kernels: one token or a token group of at most the plan's
// bulk_max_tokens (kBulkMaxTokens), int16 / int16x2 input, sm_90,
// integer-path types but MXFP4, not off in the plan, and a tile plan that
// fits shared memory (plan_bulk; the group's inputs are staged together).
Refusal can_implement_bulk(const KernelPlan& p, const DeviceTraits& dev, const GemvShape& g, int ntok = 1);
// A matmul of 2 .. bulk_max_tokens tokens as the bulk kernels' token groups
// (each weight read once per group, each token's sums those of a
// single-token launch): plain or SwiGLU inputs in the fast form (or an
// RMSNorm under bulk_group_norm), one type
// or types of the mixed launch, and groups of two at least fit. Taken
// before the GEMM, and before a batched step's one call per token.
Refusal can_implement_bulk_groups(const KernelPlan& p, const DeviceTraits& dev, const MatmulShape& m);
// The call's scratch a token group of `ntok` under launch b needs for its
// inputs quantized once (BulkLaunch::prequant): the tokens' chunks, then,
// with an RMSNorm (bulk_group_norm), each token's 1 / rms. Without it (or
// under bulk_group_stage_cols) each block stages the inputs itself.
size_t bulk_group_scratch(const BulkLaunch& b, int ntok, bool norm);
// The one-token slice ring (gemv_slice_ring.cu, bulk_slices): on in the
// plan, one token, int16 / int16x2 input, whole 32-element chunks, rows of
// whole blocks of integer-path types but MXFP4 (segments of different
// types: mixed_launch_type's), and under bulk_slices 1 one Q6_K matrix of
// 12288+ inputs a row that a tile (bulk_tile_kb) holds fewer than two rows
// of (the only shapes it was measured faster on; plan_bulk_slice_ring also
// keeps it to one wave of one-row warps). The bulk kernels' own conditions
// (can_implement_bulk: sm_90, gemv_bulk) come first.
Refusal can_implement_slice_ring(const KernelPlan& p, const GemvShape& g, int ntok = 1);
// One launch over segments of different types: one token, an integer
// input, the plan's gemv_mixed, every type a mixed_launch_type.
Refusal can_implement_mixed(const KernelPlan& p, const GemvShape& g, int ntok);
// The GEMV family at all: inputs in the fast form, at most kGemvMaxTokens
// tokens unless the workspace takes them (then the GEMM runs it).
Refusal can_implement_gemv(const MatmulShape& m);
// cuBLAS through the prefill workspace: attached, on for this many tokens,
// no fused norm.
Refusal can_implement_cublas(const MatmulShape& m);
// The FFN pair kernel (ffn_decode.cu: gate and up with SwiGLU in one
// launch, its output the down matmul's input chunks): `gate_up` is gate and
// up as two segments of one integer type (not MXFP4) and rows of whole
// warps, int16 / int16x2 input; `down`, when given, an integer type
// reading them.
Refusal can_implement_pair(const KernelPlan& p, const GemvShape& gate_up, const GemvShape* down = nullptr);

// The route of one matmul() call.
MatmulRoute route_matmul(const KernelPlan& p, const DeviceTraits& dev, const MatmulShape& m);
// The route of one gemv() call (the GEMV family whatever the token count).
MatmulRoute route_gemv(const KernelPlan& p, const DeviceTraits& dev, const MatmulShape& m);
// One line: the shape, then each launch and its parameters, e.g. "Q4_K
// 4864x896: gemv_bulk_kernel: 2 rows/tile, 8 warps/block, 152 blocks, int16 input".
std::string describe_route(const KernelPlan& p, const MatmulShape& m, const MatmulRoute& r);
// "Q4_K 896x4864 + Q8_0 128x4864"
std::string shape_text(const GemvShape& g);

// ---- a batched step's dense matmuls
// Steps of 2 .. this many tokens run one single-token matmul per token
// (side streams); more, and one token, one matmul of the step's tokens
// (cuBLAS from this + 1 on: the plugins set the prefill workspace's
// threshold to it). `mirrored`: the model keeps FP16 weight mirrors.
int step_per_token_max(const KernelPlan& p, bool mirrored);
// The route of one of a step's matmuls of `ntok` tokens: `per_token` when
// it runs as ntok single-token calls (`route` is then one call's).
struct StepRoute {
    bool per_token = false;
    MatmulRoute route;
};
StepRoute route_step_matmul(const KernelPlan& p, const DeviceTraits& dev, const GemvShape& g, int ntok, bool mirrored,
                            bool chunk_input = false);

// The plan log's lines for a step of `ntok` tokens: one per matrix kind and
// distinct route, with the number of matrices it covers (plan_log's form),
// e.g. "ffn_down x24: Q6_K 896x4864: 8 tokens, each: gemv_bulk_kernel: ...".
std::vector<std::string> route_lines(const KernelPlan& p, const DeviceTraits& dev, const std::vector<MatrixKind>& mats,
                                     int ntok, bool mirrored);

// Lines "kind xN: what" from (kind, what) items: one per kind and distinct
// `what`, counted, in first-seen order (route_lines' form; expert_route.hpp's
// step_route_lines uses it too).
std::vector<std::string> count_kinds(const std::vector<std::pair<std::string, std::string>>& items);

}  // namespace ehcuda
