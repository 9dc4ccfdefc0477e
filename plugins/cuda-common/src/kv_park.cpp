// ABI 1.7's seq_park / seq_unpark for every CUDA engine (kv_park.hpp has the
// layout and the arena). Both run between steps (expect_idle) and wait for
// their copy, so a parked copy is whole when seq_park returns and may be
// released as soon as seq_unpark does.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ehcuda/attention_paged.hpp"
#include "ehcuda/batch.hpp"
#include "ehcuda/check.hpp"
#include "ehcuda/kv_park.hpp"

namespace ehcuda {
namespace {

constexpr uint64_t kChunkBytes = 4ull << 20;
constexpr uint64_t kSlabBytes = 64ull << 20;  // pinned at once, then cut into chunks

// Pinned, mapped chunks, by chunk size, kept for the process's life (every
// model's parks share them; freeing them at exit would race the driver's
// own teardown).
class PinnedArena {
public:
    static PinnedArena& get() {
        static PinnedArena* arena = new PinnedArena;
        return *arena;
    }
    // n chunks of `size` bytes (device pointers), or empty when the host
    // cannot pin enough (nothing is taken then).
    std::vector<char*> take(uint64_t size, size_t n) {
        std::lock_guard lock(mu_);
        std::vector<char*>& free = free_[size];
        while (free.size() < n) {
            const uint64_t slab = std::max(kSlabBytes / size, uint64_t(1)) * size;
            void* h = nullptr;
            if (cudaHostAlloc(&h, slab, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
                (void)cudaGetLastError();  // not sticky: clear it for the next call
                return {};
            }
            void* d = nullptr;
            if (cudaHostGetDevicePointer(&d, h, 0) != cudaSuccess) {
                (void)cudaGetLastError();
                cudaFreeHost(h);
                return {};
            }
            for (uint64_t off = 0; off + size <= slab; off += size) free.push_back(static_cast<char*>(d) + off);
        }
        std::vector<char*> out(free.end() - long(n), free.end());
        free.resize(free.size() - n);
        return out;
    }
    void give(uint64_t size, const std::vector<char*>& chunks) {
        std::lock_guard lock(mu_);
        free_[size].insert(free_[size].end(), chunks.begin(), chunks.end());
    }

private:
    std::mutex mu_;
    std::map<uint64_t, std::vector<char*>> free_;
};

}  // namespace

uint64_t park_chunk_bytes(uint64_t token_bytes) { return std::max(kChunkBytes, token_bytes); }

ParkedKv::ParkedKv(uint32_t n_tokens, uint64_t token_bytes) {
    const uint64_t size = park_chunk_bytes(token_bytes);
    tokens_per_chunk = uint32_t(size / token_bytes);
    const size_t n = (n_tokens + tokens_per_chunk - 1) / tokens_per_chunk;
    chunks = PinnedArena::get().take(size, n);
    if (chunks.size() != n)
        throw ehp::Error(EH_NO_CAPACITY, "seq_park: cannot pin " + std::to_string(n * size) + " bytes of host memory");
    bytes = uint64_t(n_tokens) * token_bytes;
    chunk_bytes_ = size;
}

ParkedKv::~ParkedKv() { PinnedArena::get().give(chunk_bytes_, chunks); }

void BatchBase::park_copy(const CudaSeq& seq, uint32_t n_tokens, const ParkedKv& parked, bool to_host) {
    // One upload: the plane pointers, the chunk pointers, then the block ids.
    const int n_planes = 2 * shape_.n_layer;
    const uint32_t n_blocks = ehp::park_blocks(n_tokens, uint32_t(kPagedBlockTokens));
    const size_t n_ptrs = size_t(n_planes) + parked.chunks.size();
    std::vector<char> table(n_ptrs * sizeof(void*) + n_blocks * sizeof(int32_t));
    auto* ptrs = reinterpret_cast<void**>(table.data());
    for (int l = 0; l < shape_.n_layer; ++l) {
        ptrs[2 * l] = k_pool(l);
        ptrs[2 * l + 1] = v_pool(l);
    }
    for (size_t c = 0; c < parked.chunks.size(); ++c) ptrs[size_t(n_planes) + c] = parked.chunks[c];
    auto* ids = reinterpret_cast<int32_t*>(table.data() + n_ptrs * sizeof(void*));
    for (uint32_t b = 0; b < n_blocks; ++b) ids[b] = int32_t(seq.blocks.blocks()[b]);
    DeviceBuffer d_table(table.size(), shape_.ledger);
    EHC_CHECK(cudaMemcpyAsync(d_table.get(), table.data(), table.size(), cudaMemcpyHostToDevice, stream()));
    auto* d_ptrs = d_table.as<void*>();
    kv_park_copy(reinterpret_cast<__half* const*>(d_ptrs), n_planes,
                 reinterpret_cast<const int32_t*>(d_table.as<char>() + n_ptrs * sizeof(void*)), int(n_tokens),
                 int(kPagedBlockTokens), int(row_bytes_ / sizeof(__half)), reinterpret_cast<char* const*>(d_ptrs + n_planes),
                 int(parked.tokens_per_chunk), to_host, stream());
    EHC_CHECK(cudaStreamSynchronize(stream()));
}

std::unique_ptr<ParkedKv> BatchBase::park(const CudaSeq& seq, uint32_t n_tokens, uint64_t max_bytes,
                                          uint64_t* out_bytes) {
    expect_idle("seq_park");
    const uint64_t token_bytes = 2ull * uint64_t(shape_.n_layer) * uint64_t(row_bytes_);
    *out_bytes = uint64_t(n_tokens) * token_bytes;
    ehp::check_park_bytes(*out_bytes, max_bytes);
    auto p = std::make_unique<ParkedKv>(n_tokens, token_bytes);
    p->owner = this;
    p->meta = ehp::park_meta(this, seq.blocks, n_tokens);
    p->adapter = seq.adapter;
    park_copy(seq, n_tokens, *p, true);
    return p;
}

std::unique_ptr<CudaSeq> BatchBase::unpark(const ParkedKv* p, const int32_t* tokens, uint32_t n_tokens) {
    expect_idle("seq_unpark");
    ehp::check_unpark(p ? &p->meta : nullptr, this, tokens, n_tokens, *pool_);
    std::unique_ptr<CudaSeq> s = create();  // NO_CAPACITY before any block is taken
    ehp::adopt_parked(s->blocks, p->meta);
    s->adapter = p->adapter;
    try {
        park_copy(*s, n_tokens, *p, false);
    } catch (...) {
        forget(s.get());
        throw;
    }
    return s;
}

}  // namespace ehcuda
