// ABI 1.7's seq_park / seq_unpark for every CUDA engine (kv_park.hpp has the
// layout). Both run between steps (expect_idle) and wait for their copy, so
// a parked copy is whole when seq_park returns and may be released as soon
// as seq_unpark does.
#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "ehcuda/attention_paged.hpp"
#include "ehcuda/batch.hpp"
#include "ehcuda/check.hpp"
#include "ehcuda/kv_park.hpp"

namespace ehcuda {

ParkedKv::ParkedKv(uint64_t n) {
    void* p = nullptr;
    if (cudaHostAlloc(&p, n ? n : 1, cudaHostAllocMapped) != cudaSuccess) {
        (void)cudaGetLastError();  // not sticky: clear it for the next call
        throw ehp::Error(EH_NO_CAPACITY, "seq_park: cannot pin " + std::to_string(n) + " bytes of host memory");
    }
    host = static_cast<__half*>(p);
    void* d = nullptr;
    if (cudaHostGetDevicePointer(&d, p, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        cudaFreeHost(p);
        host = nullptr;
        throw ehp::Error(EH_UNSUPPORTED, "seq_park: the device cannot map pinned host memory");
    }
    mapped = static_cast<__half*>(d);
    bytes = n;
}

ParkedKv::~ParkedKv() {
    if (host) cudaFreeHost(host);
}

void BatchBase::park_copy(const CudaSeq& seq, uint32_t n_tokens, __half* mapped, bool to_host) {
    // One upload: the plane pointers, then the block ids.
    const int n_planes = 2 * shape_.n_layer;
    const uint32_t n_blocks = ehp::park_blocks(n_tokens, uint32_t(kPagedBlockTokens));
    std::vector<char> table(size_t(n_planes) * sizeof(void*) + n_blocks * sizeof(int32_t));
    auto* planes = reinterpret_cast<__half**>(table.data());
    for (int l = 0; l < shape_.n_layer; ++l) {
        planes[2 * l] = k_pool(l);
        planes[2 * l + 1] = v_pool(l);
    }
    auto* ids = reinterpret_cast<int32_t*>(table.data() + size_t(n_planes) * sizeof(void*));
    for (uint32_t b = 0; b < n_blocks; ++b) ids[b] = int32_t(seq.blocks.blocks()[b]);
    DeviceBuffer d_table(table.size(), shape_.ledger);
    EHC_CHECK(cudaMemcpyAsync(d_table.get(), table.data(), table.size(), cudaMemcpyHostToDevice, stream()));
    kv_park_copy(d_table.as<__half*>(), n_planes,
                 reinterpret_cast<const int32_t*>(d_table.as<char>() + size_t(n_planes) * sizeof(void*)),
                 int(n_tokens), int(kPagedBlockTokens), shape_.kv_dim, mapped, to_host, stream());
    EHC_CHECK(cudaStreamSynchronize(stream()));
}

std::unique_ptr<ParkedKv> BatchBase::park(const CudaSeq& seq, uint32_t n_tokens, uint64_t max_bytes,
                                          uint64_t* out_bytes) {
    expect_idle("seq_park");
    const uint64_t bytes = 2ull * uint64_t(shape_.n_layer) * n_tokens * uint64_t(shape_.kv_dim) * sizeof(__half);
    *out_bytes = bytes;
    ehp::check_park_bytes(bytes, max_bytes);
    auto p = std::make_unique<ParkedKv>(bytes);
    p->owner = this;
    p->meta = ehp::park_meta(this, seq.blocks, n_tokens);
    park_copy(seq, n_tokens, p->mapped, true);
    return p;
}

std::unique_ptr<CudaSeq> BatchBase::unpark(const ParkedKv* p, const int32_t* tokens, uint32_t n_tokens) {
    expect_idle("seq_unpark");
    ehp::check_unpark(p ? &p->meta : nullptr, this, tokens, n_tokens, *pool_);
    std::unique_ptr<CudaSeq> s = create();  // NO_CAPACITY before any block is taken
    ehp::adopt_parked(s->blocks, p->meta);
    try {
        park_copy(*s, n_tokens, p->mapped, false);
    } catch (...) {
        forget(s.get());
        throw;
    }
    return s;
}

}  // namespace ehcuda
