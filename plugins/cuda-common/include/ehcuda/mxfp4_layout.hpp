// MXFP4 tensors on the device: the file's ggml rows (17 bytes per 32-value
// block) are rearranged at upload into the device layout that every device
// reader expects (defined, with its accessors, in mxfp4.cuh): the same
// exponents and codes, grouped so each block's codes are one aligned
// 16-byte load. Host-callable from plain C++.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ehcuda {

// Bytes of one ggml MXFP4 row of `cols` values (17 per 32); 0 if cols is
// not a positive multiple of 32.
size_t mxfp4_file_row_bytes(int64_t cols);
// Bytes of one device row of `cols` values: 17 * nb rounded up to a
// multiple of 16 (nb = cols / 32); 0 if cols is not a positive multiple of 32.
size_t mxfp4_device_row_bytes(int64_t cols);

// Rewrites `rows` ggml rows at src_dev (mxfp4_file_row_bytes(cols) apart,
// any alignment) into device rows at dst_dev (16-byte aligned,
// mxfp4_device_row_bytes(cols) apart), padding bytes zeroed; enqueued on
// stream. Throws ehp::Error on a bad cols or a launch failure.
void mxfp4_repack_rows(const void* src_dev, void* dst_dev, int64_t rows, int cols, cudaStream_t stream);

}  // namespace ehcuda
