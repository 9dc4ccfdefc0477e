// ABI 1.7's host-memory tier for the CUDA engines: a sequence's K/V parked
// in pinned, device-mapped host memory (cudaHostAlloc), laid out plane after
// plane (K of layer 0, V of layer 0, K of layer 1, ...), each plane the
// parked positions' rows in order. One kernel gathers the rows from the
// paged pool's blocks straight into host memory, and one scatters them back
// into a new sequence's fresh blocks: no device staging buffer, and one
// launch whatever the block count (a copy per block and layer would be
// thousands of calls for a long prefix).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include <engine_host/kv_park.hpp>

// The ABI's opaque parked handle (plugin_abi.h, 1.7).
struct eh_parked {
    const void* owner = nullptr;  // the BatchBase it came from
};

namespace ehcuda {

class ParkedKv : public eh_parked {
public:
    // Pinned, mapped host memory of `bytes`; throws ehp::Error(NO_CAPACITY)
    // when the host cannot pin that much.
    explicit ParkedKv(uint64_t bytes);
    ~ParkedKv();
    ParkedKv(const ParkedKv&) = delete;
    ParkedKv& operator=(const ParkedKv&) = delete;

    ehp::ParkedMeta meta;
    uint64_t bytes = 0;
    __half* host = nullptr;    // the host's pointer
    __half* mapped = nullptr;  // the same memory as the device sees it
};

// Copies n_tokens rows of kv_dim halves per plane between the pool and
// `mapped` (to_host: pool -> host; else host -> pool). d_planes holds
// n_planes plane base pointers, d_blocks the sequence's block ids (position
// p is row p % block_tokens of block d_blocks[p / block_tokens]). On
// `stream`; the caller synchronizes.
void kv_park_copy(__half* const* d_planes, int n_planes, const int32_t* d_blocks, int n_tokens, int block_tokens,
                  int kv_dim, __half* mapped, bool to_host, cudaStream_t stream);

}  // namespace ehcuda
