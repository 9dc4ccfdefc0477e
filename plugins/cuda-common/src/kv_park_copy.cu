// The host-memory tier's copies (kv_park.hpp): one thread block per group
// of positions of one plane, each thread moving 16-byte pieces of a row
// when the row is a whole number of them (every head_dim the plugins
// serve), else halves.
#include "ehcuda/check.hpp"
#include "ehcuda/kv_park.hpp"

namespace ehcuda {
namespace {

constexpr int kTokensPerBlock = 8;
constexpr int kThreads = 256;

template <class Piece>
__global__ void kv_park_kernel(__half* const* planes, const int32_t* blocks, int n_tokens, int block_tokens,
                               int pieces_per_row, char* const* chunks, int tokens_per_chunk, bool to_host) {
    const int plane = blockIdx.y, n_planes = gridDim.y;
    Piece* pool = reinterpret_cast<Piece*>(planes[plane]);
    const int first = blockIdx.x * kTokensPerBlock;
    const int last = min(first + kTokensPerBlock, n_tokens);
    const int per = (last - first) * pieces_per_row;
    for (int i = threadIdx.x; i < per; i += blockDim.x) {
        const int t = first + i / pieces_per_row, c = i % pieces_per_row;
        const size_t row = size_t(blocks[t / block_tokens]) * block_tokens + t % block_tokens;
        Piece* p = pool + row * pieces_per_row + c;
        Piece* h = reinterpret_cast<Piece*>(chunks[t / tokens_per_chunk]) +
                   (size_t(t % tokens_per_chunk) * n_planes + plane) * pieces_per_row + c;
        if (to_host)
            *h = *p;
        else
            *p = *h;
    }
}

}  // namespace

void kv_park_copy(__half* const* d_planes, int n_planes, const int32_t* d_blocks, int n_tokens, int block_tokens,
                  int kv_dim, char* const* d_chunks, int tokens_per_chunk, bool to_host, cudaStream_t stream) {
    if (n_tokens <= 0 || n_planes <= 0) return;
    const dim3 grid(unsigned((n_tokens + kTokensPerBlock - 1) / kTokensPerBlock), unsigned(n_planes));
    if (kv_dim % 8 == 0)
        kv_park_kernel<uint4><<<grid, kThreads, 0, stream>>>(d_planes, d_blocks, n_tokens, block_tokens, kv_dim / 8,
                                                            d_chunks, tokens_per_chunk, to_host);
    else
        kv_park_kernel<__half><<<grid, kThreads, 0, stream>>>(d_planes, d_blocks, n_tokens, block_tokens, kv_dim,
                                                             d_chunks, tokens_per_chunk, to_host);
    EHC_LAUNCHED("kv_park_kernel");
}

}  // namespace ehcuda
