#include "park.hpp"

#include <algorithm>
#include <new>
#include <string>

namespace cpuref {
namespace {

// fn(plane's layer, is V, pool row, rows, offset in the parked bytes) for
// every run of consecutive rows of the sequence's first n positions.
template <class Fn>
void each_run(const KvPool& pool, const ehp::SeqBlocks& blocks, uint32_t n, Fn&& fn) {
    const uint32_t B = pool.blocks().block_tokens();
    const uint64_t rb = pool.stored_row_bytes();
    for (uint32_t l = 0; l < pool.n_layer(); ++l)
        for (int v = 0; v < 2; ++v) {
            const uint64_t plane = (2ull * l + uint64_t(v)) * n * rb;
            for (uint32_t p = 0; p < n; p += B) {
                const uint32_t count = std::min(B, n - p);
                fn(l, v != 0, blocks.row(p), count, plane + uint64_t(p) * rb);
            }
        }
}

}  // namespace

std::unique_ptr<Parked> park(eh_model* model, const Sequence& seq, uint32_t n_tokens, uint64_t max_bytes,
                             uint64_t* out_bytes) {
    const KvPool& pool = seq.pool();
    const uint64_t bytes = 2ull * pool.n_layer() * n_tokens * pool.stored_row_bytes();
    *out_bytes = bytes;
    ehp::check_park_bytes(bytes, max_bytes);
    auto p = std::make_unique<Parked>();
    p->owner = model;
    p->meta = ehp::park_meta(model, seq.blocks, n_tokens);
    p->adapter = seq.adapter;
    p->next_pos.assign(seq.next_pos.begin(), seq.next_pos.begin() + std::min<size_t>(n_tokens, seq.next_pos.size()));
    try {
        p->rows.resize(bytes);
    } catch (const std::bad_alloc&) {
        throw ehp::Error(EH_NO_CAPACITY, "seq_park: cannot allocate " + std::to_string(bytes) + " bytes of host memory");
    }
    each_run(pool, seq.blocks, n_tokens, [&](uint32_t l, bool v, uint64_t row, uint32_t count, uint64_t at) {
        pool.read_rows(l, v, row, count, p->rows.data() + at);
    });
    return p;
}

std::unique_ptr<Sequence> unpark(Batch& batch, eh_model* model, const Parked* parked, const int32_t* tokens,
                                 uint32_t n_tokens) {
    std::unique_ptr<Sequence> s = batch.create();  // NO_CAPACITY when max_seqs are alive
    try {
        ehp::check_unpark(parked ? &parked->meta : nullptr, model, tokens, n_tokens, s->pool().blocks());
        ehp::adopt_parked(s->blocks, parked->meta);
        s->adapter = parked->adapter;
        s->next_pos = parked->next_pos;
        KvPool& pool = s->pool();
        each_run(pool, s->blocks, n_tokens, [&](uint32_t l, bool v, uint64_t row, uint32_t count, uint64_t at) {
            pool.write_rows(l, v, row, count, parked->rows.data() + at);
        });
    } catch (...) {
        batch.forget(s.get());
        throw;
    }
    return s;
}

}  // namespace cpuref
