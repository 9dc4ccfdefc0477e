// ABI 1.7's host-memory tier for the CUDA engines: a sequence's K/V parked
// in pinned, device-mapped host memory. The memory comes in fixed-size
// chunks from a process-wide arena that keeps what it pinned: pinning
// (cudaHostAlloc) costs about as much as the copy itself, and a park
// happens while a request waits for blocks, so it is paid once per chunk,
// not once per park. The arena holds at most the host's high-water mark of
// parked bytes (the host keeps that under --kv-host-bytes), plus a chunk's
// rounding per parked copy.
// Inside a copy, positions lie in order, each position's rows of every
// plane (K of layer 0, V of layer 0, K of layer 1, ...) together, a whole
// number of positions per chunk. One kernel gathers the rows from the paged
// pool's blocks straight into the chunks, and one scatters them back into a
// new sequence's fresh blocks: one launch whatever the block count (a copy
// per block and layer would be thousands of calls for a long prefix).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include <engine_host/kv_park.hpp>

// The ABI's opaque parked handle (plugin_abi.h, 1.7).
struct eh_parked {
    const void* owner = nullptr;  // the BatchBase it came from
};

namespace ehcuda {

class ParkedKv : public eh_parked {
public:
    // Chunks for n_tokens positions of token_bytes each; throws
    // ehp::Error(NO_CAPACITY) when the host cannot pin them (nothing kept).
    ParkedKv(uint32_t n_tokens, uint64_t token_bytes);
    ~ParkedKv();  // the chunks go back to the arena
    ParkedKv(const ParkedKv&) = delete;
    ParkedKv& operator=(const ParkedKv&) = delete;

    ehp::ParkedMeta meta;
    uint64_t bytes = 0;              // the positions' bytes (what the host budgets)
    uint32_t tokens_per_chunk = 0;
    int32_t adapter = -1;            // the parked sequence's LoRA slot (CudaSeq::adapter)
    std::vector<char*> chunks;       // as the device sees them (mapped)

private:
    uint64_t chunk_bytes_ = 0;
};

// The arena's chunk size: 4 MiB, or one position's bytes when larger.
uint64_t park_chunk_bytes(uint64_t token_bytes);

// Copies n_tokens positions of n_planes rows of kv_dim halves (a quantized
// pool's row bytes / 2, kv_quant.hpp) between the
// pool and the chunks (to_host: pool -> chunks; else chunks -> pool).
// d_planes holds n_planes plane base pointers, d_blocks the sequence's
// block ids (position p is row p % block_tokens of block
// d_blocks[p / block_tokens]), d_chunks the chunks' device pointers, each
// holding tokens_per_chunk positions. On `stream`; the caller synchronizes.
void kv_park_copy(__half* const* d_planes, int n_planes, const int32_t* d_blocks, int n_tokens, int block_tokens,
                  int kv_dim, char* const* d_chunks, int tokens_per_chunk, bool to_host, cudaStream_t stream);

}  // namespace ehcuda
