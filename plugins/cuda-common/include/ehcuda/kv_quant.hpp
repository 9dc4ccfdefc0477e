// The element types of the CUDA plugins' paged KV pool (kv_init's kv_type,
// ABI 1.4) and the byte layout of one pool row (one position's
// [n_kv][head_dim] values of one layer's K or V):
//   F16              kv_dim halves.
//   Q8_0, FP8_E4M3   kv_dim one-byte codes, then kv_dim / 32 FP16 scales
//                    (scale j covers codes 32 j .. 32 j + 31: a head's codes
//                    are contiguous, and its scales where the head dim is a
//                    multiple of 32; otherwise blocks span heads, as the
//                    CPU reference's row blocks do), the row padded to 16
//                    bytes. A value is scale * code, the code an int8
//                    (Q8_0) or an OCP E4M3 (FP8_E4M3): the blocks of
//                    quant_blocks.hpp (block_q8_0, block_fp8_e4m3), their
//                    codes and scales stored apart so that the kernels read
//                    a head's codes as whole 8- and 16-byte pieces.
// A row stays one unit of bytes, so a block's copy (fork, the host-memory
// tier) copies rows whatever the type.
#pragma once

#include <cstddef>
#include <cstdint>

#include <engine_host/tensor_types.h>

#ifdef __CUDACC__
#define EHCUDA_KV_HD __host__ __device__
#else
#define EHCUDA_KV_HD
#endif

namespace ehcuda {

// Values per scale of a quantized row.
constexpr int kKvQuantBlock = 32;

EHCUDA_KV_HD constexpr bool kv_type_quantized(uint32_t type) {
    return type == EH_TYPE_Q8_0 || type == EH_TYPE_FP8_E4M3;
}

// Bytes of one pool row of kv_dim values (kv_dim % 32 == 0 for the quantized
// types); 0 for a type the pool does not store.
EHCUDA_KV_HD constexpr size_t kv_row_bytes(uint32_t type, int kv_dim) {
    if (type == EH_TYPE_F16) return size_t(kv_dim) * 2;
    if (!kv_type_quantized(type) || kv_dim % kKvQuantBlock) return 0;
    return (size_t(kv_dim) + size_t(kv_dim) / kKvQuantBlock * 2 + 15) / 16 * 16;
}

// Byte offset of the first scale in a quantized row.
EHCUDA_KV_HD constexpr size_t kv_scale_offset(int kv_dim) { return size_t(kv_dim); }

}  // namespace ehcuda
