#include "ehcuda/step_attention.hpp"

#include <algorithm>

#include "ehcuda/attention_decode_group.hpp"
#include "ehcuda/attention_paged.hpp"
#include "ehcuda/attention_prefill.hpp"
#include "ehcuda/attention_span.hpp"

namespace ehcuda {
namespace {

// Rows first .. first + n - 1, each through its own sequence's table.
void rows(const StepAttnArgs& a, const StepView& v, int first, int n, cudaStream_t s) {
    if (n <= 0) return;
    PagedAttnArgs at;
    at.q = a.q + size_t(first) * a.ldq;
    at.ldq = a.ldq;
    at.k_pool = a.k_pool;
    at.v_pool = a.v_pool;
    at.kv_type = a.kv_type;
    at.n_head = a.n_head;
    at.n_kv = a.n_kv;
    at.head_dim = a.head_dim;
    at.ntok = n;
    at.d_pos = v.d_pos + first;
    at.d_table = v.d_table + first;
    at.tables = v.d_tables;
    at.window = a.window;
    at.sinks = a.sinks;
    at.scale = a.scale;
    at.out = a.out + size_t(first) * a.ldo;
    at.ldo = a.ldo;
    if (a.group && attention_decode_group_takes(at)) {
        const size_t per_split = size_t(n) * a.n_head * (a.head_dim + 2);
        const int cap = int(std::min<size_t>(a.group_scratch_floats / per_split, kAttentionGroupMaxSplits));
        const int nsplit = cap >= 2 ? attention_decode_group_splits(cap, a.n_kv, n) : 1;
        attention_decode_group(at, a.group_scratch, nsplit, s);
        return;
    }
    attention_paged(at, s);
}

// A prefill chunk of one sequence on the tensor cores, its keys read
// through its block table.
void chunk(const StepAttnArgs& a, const StepView& v, const StepSpan& sp, cudaStream_t s) {
    AttnArgs at;
    at.q = a.q + size_t(sp.first) * a.ldq;
    at.ldq = a.ldq;
    at.k_cache = a.k_pool;
    at.v_cache = a.v_pool;
    at.kv_table = v.d_tables + sp.table;
    at.kv_type = a.kv_type;
    at.n_head = a.n_head;
    at.n_kv = a.n_kv;
    at.head_dim = a.head_dim;
    at.d_pos0 = v.d_pos + sp.first;
    at.ntok = sp.n;
    at.window = a.window;
    at.sinks = a.sinks;
    at.scale = a.scale;
    at.out = a.out + size_t(sp.first) * a.ldo;
    at.ldo = a.ldo;
    attention_prefill(at, attention_split_scratch(*a.pw), s);
}

// An image's span: its rows see each other (F16 pools: the plugin refuses
// images with a quantized cache).
void span(const StepAttnArgs& a, const StepView& v, const StepSpan& sp, cudaStream_t s) {
    SpanAttnArgs at;
    at.q = a.q + size_t(sp.first) * a.ldq;
    at.ldq = a.ldq;
    at.k_pool = a.k_pool;
    at.v_pool = a.v_pool;
    at.n_head = a.n_head;
    at.n_kv = a.n_kv;
    at.head_dim = a.head_dim;
    at.ntok = sp.n;
    at.d_pos = v.d_pos + sp.first;
    at.d_table = v.d_table + sp.first;
    at.tables = v.d_tables;
    at.d_reach = a.d_reach + sp.first;
    at.window = a.window;
    at.scale = a.scale;
    at.out = a.out + size_t(sp.first) * a.ldo;
    at.ldo = a.ldo;
    attention_span(at, s);
}

}  // namespace

void step_attention(const StepAttnArgs& a, const StepView& v, cudaStream_t stream) {
    // (an FP16 pool without sinks or with them: attention_prefill_takes
    // holds for every head dim the tensor cores take)
    const bool mma = attention_prefill_mma_takes(a.head_dim);
    int run = 0;  // tokens run .. are not attended yet (spans lie in token order)
    for (int i = 0; i < v.nspans; ++i) {
        const StepSpan& sp = v.spans[i];
        const bool both_ways = a.bidirectional && a.bidirectional(i);
        if (!both_ways && (!mma || sp.n < kStepTensorCoreChunk)) continue;
        rows(a, v, run, sp.first - run, stream);
        if (both_ways) span(a, v, sp, stream);
        else chunk(a, v, sp, stream);
        run = sp.first + sp.n;
    }
    rows(a, v, run, v.ntok - run, stream);
}

}  // namespace ehcuda
