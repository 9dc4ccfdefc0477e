// The host-memory tier's copies (kv_park.hpp): one thread block per group
// of positions of one plane, each thread moving 16-byte chunks of a row
// when the row is a whole number of them (every head_dim the plugins
// serve), else halves.
#include "ehcuda/check.hpp"
#include "ehcuda/kv_park.hpp"

namespace ehcuda {
namespace {

constexpr int kTokensPerBlock = 8;
constexpr int kThreads = 256;

template <class Chunk>
__global__ void kv_park_kernel(__half* const* planes, const int32_t* blocks, int n_tokens, int block_tokens,
                               int chunks_per_row, Chunk* mapped, bool to_host) {
    const int plane = blockIdx.y;
    Chunk* pool = reinterpret_cast<Chunk*>(planes[plane]);
    Chunk* host = mapped + size_t(plane) * size_t(n_tokens) * chunks_per_row;
    const int first = blockIdx.x * kTokensPerBlock;
    const int last = min(first + kTokensPerBlock, n_tokens);
    const int per = (last - first) * chunks_per_row;
    for (int i = threadIdx.x; i < per; i += blockDim.x) {
        const int t = first + i / chunks_per_row, c = i % chunks_per_row;
        const size_t row = size_t(blocks[t / block_tokens]) * block_tokens + t % block_tokens;
        Chunk* p = pool + row * chunks_per_row + c;
        Chunk* h = host + size_t(t) * chunks_per_row + c;
        if (to_host)
            *h = *p;
        else
            *p = *h;
    }
}

}  // namespace

void kv_park_copy(__half* const* d_planes, int n_planes, const int32_t* d_blocks, int n_tokens, int block_tokens,
                  int kv_dim, __half* mapped, bool to_host, cudaStream_t stream) {
    if (n_tokens <= 0 || n_planes <= 0) return;
    const dim3 grid(unsigned((n_tokens + kTokensPerBlock - 1) / kTokensPerBlock), unsigned(n_planes));
    if (kv_dim % 8 == 0)
        kv_park_kernel<uint4><<<grid, kThreads, 0, stream>>>(d_planes, d_blocks, n_tokens, block_tokens, kv_dim / 8,
                                                            reinterpret_cast<uint4*>(mapped), to_host);
    else
        kv_park_kernel<__half><<<grid, kThreads, 0, stream>>>(d_planes, d_blocks, n_tokens, block_tokens, kv_dim,
                                                             mapped, to_host);
    EHC_LAUNCHED("kv_park_kernel");
}

}  // namespace ehcuda
