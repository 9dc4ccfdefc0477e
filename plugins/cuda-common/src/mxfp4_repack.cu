// ggml MXFP4 rows -> the device layout of mxfp4.cuh, one thread per block.
#include <engine_host/plugin_abi.hpp>

#include <string>

#include "ehcuda/check.hpp"
#include "ehcuda/mxfp4.cuh"
#include "ehcuda/mxfp4_layout.hpp"

namespace ehcuda {
namespace {

constexpr int kThreads = 256;

// Thread i: block c = i % nb of row i / nb. The 16 code bytes become four
// words, word k = values 4k..4k+3 (low nibbles of qs[4k..4k+3]) in nibbles
// 0..3 and values 16+4k.. (their high nibbles) in nibbles 4..7. The thread
// of a row's last block also zeroes the exponent padding of a partial group.
__global__ void __launch_bounds__(kThreads) repack_kernel(const uint8_t* src, uint8_t* dst, int64_t rows, int nb,
                                                          size_t dst_row_bytes) {
    const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
    if (i >= rows * nb) return;
    const int64_t r = i / nb;
    const int c = int(i % nb);
    const uint8_t* b = src + size_t(i) * 17;
    uint8_t* row = dst + size_t(r) * dst_row_bytes;
    row[mxfp4_exp_offset(c)] = b[0];
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        uint32_t v = 0;
#pragma unroll
        for (int n = 0; n < 4; ++n) {
            const uint32_t q = b[1 + 4 * k + n];
            v |= (q & 15u) << (4 * n) | (q >> 4) << (16 + 4 * n);
        }
        w[k] = v;
    }
    *reinterpret_cast<uint4*>(row + mxfp4_codes_offset(c)) = make_uint4(w[0], w[1], w[2], w[3]);
    const int m = nb % kMxfp4GroupBlocks;
    if (c == nb - 1 && m != 0)
        for (int p = m; p < kMxfp4GroupBlocks; ++p) row[mxfp4_exp_offset(nb - m) + p] = 0;
}

}  // namespace

size_t mxfp4_file_row_bytes(int64_t cols) { return cols > 0 && cols % 32 == 0 ? size_t(cols / 32) * 17 : 0; }

size_t mxfp4_device_row_bytes(int64_t cols) {
    return cols > 0 && cols % 32 == 0 ? mxfp4_device_row_bytes_nb(cols / 32) : 0;
}

void mxfp4_repack_rows(const void* src_dev, void* dst_dev, int64_t rows, int cols, cudaStream_t stream) {
    const size_t drb = mxfp4_device_row_bytes(cols);
    if (drb == 0) throw ehp::Error(EH_INTERNAL, "mxfp4_repack_rows: cols " + std::to_string(cols) + " is not a positive multiple of 32");
    if (reinterpret_cast<uintptr_t>(dst_dev) % 16)
        throw ehp::Error(EH_INTERNAL, "mxfp4_repack_rows: destination is not 16-byte aligned");
    if (rows <= 0) return;
    const int nb = cols / 32;
    const int64_t n = rows * nb;
    repack_kernel<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        static_cast<const uint8_t*>(src_dev), static_cast<uint8_t*>(dst_dev), rows, nb, drb);
    EHC_LAUNCHED("mxfp4_repack_kernel");
}

}  // namespace ehcuda
