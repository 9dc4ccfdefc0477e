// The dense prefill slab of a model whose matrices have no FP16 mirror
// (weight_mirror.hpp): how much of a matrix is dequantized before each
// cuBLAS GEMM of a multi-token step (prefill_gemm.cu).
//
// A slab of a few MiB stays in L2 between its dequantization and its GEMM,
// but cuts a large model's matmul into GEMMs too short to fill the GPU: on
// one H200, Gemma 3 27B Q4_K_M prefill of 512 tokens ran at 2,406 tok/s in
// the 12 MiB default slabs and 7,437 in slabs holding each call whole
// (gate|up: 43,008 x 5,376); 2,048 tokens 3,417 -> 9,099; Phi-3-mini with
// its mirror off 32,280 -> 43,542. Sizes in between were uneven (64 MiB:
// 2,257, 192 MiB: 2,975), so the slab holds the largest call or keeps the
// default, nothing between. A model with a mirror reads FP16 rows in place
// and keeps the small default.
#pragma once

#include <cstddef>
#include <vector>

namespace ehcuda {

// The dense slab a model keeps unless its load sizes one
// (PrefillShape::dense_slab_bytes): small enough to stay in L2 between its
// dequantization and the GEMM that reads it (H100, Phi-3-mini pp512: 18,976
// tok/s at 12 MiB vs 10,746 at 32 MiB), which is what a model with FP16
// mirrors or small calls wants.
constexpr size_t kDefaultDenseSlabBytes = size_t(12) << 20;

// The most a whole-call slab takes (Llama-3-70B's gate|up is 940 MB; a
// larger call runs in slabs of this size, still GEMMs that fill the GPU).
constexpr int kMaxWholeGemmSlabMb = 1024;

// KernelPlan::prefill_dense_slab_mb (and prefill_slab_mb, which bounds it)
// for matmul calls of these FP16 sizes (a call's segments together: Q|K|V,
// gate|up): the largest call's MiB, rounded up, at most
// kMaxWholeGemmSlabMb; 0 (the workspace's default slab) when no call is
// larger than that default.
int whole_gemm_slab_mb(const std::vector<size_t>& call_bytes);

}  // namespace ehcuda
