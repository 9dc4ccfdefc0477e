// llama_cuda::Batch's M-RoPE half (qwen2vl): each step's tokens placed by
// their sequences' positions (mrope_positions.hpp), the shifts uploaded in
// front of the step, and Q and K turned by them in each layer before the
// attention (mrope_shift.cu); forks and parked copies carry the positions.
// Other models do none of it.
#include <ehcuda/check.hpp>
#include <ehcuda/kv_park.hpp>

#include "batch.hpp"
#include "mrope_shift.hpp"

namespace llama_cuda {

void Batch::place_mrope(eh_step_entry* entries, uint32_t n_entries) {
    if (!c_.mrope.active() || !entries || n_entries == 0 || entries[0].struct_size < sizeof(eh_step_entry)) return;
    const uint32_t stride = entries[0].struct_size;
    // (a step the base refuses is left to it: nothing placed here is read
    // before the sequence holds the tokens)
    uint64_t total = 0;
    for (uint32_t i = 0; i < n_entries; ++i) {
        const eh_step_entry& e = ehp::step_entry(entries, stride, i);
        if (!e.seq || !owns(static_cast<const ehcuda::CudaSeq*>(e.seq))) return;
        total += e.n_tokens;
    }
    if (total > uint64_t(max_step_tokens())) return;
    shifts_.assign(std::max<size_t>(size_t(total), shift_rows_), MropePositions::Shift{});
    bool any = false;
    size_t t = 0;
    for (uint32_t i = 0; i < n_entries; ++i) {
        const eh_step_entry& e = ehp::step_entry(entries, stride, i);
        const auto* seq = static_cast<const ehcuda::CudaSeq*>(e.seq);
        const std::vector<eh_embd_span>& spans = images_.spans(i);
        any = mrope_.place(seq, seq->blocks.length(), e.n_tokens, spans.data(), uint32_t(spans.size()),
                           shifts_.data() + t) || any;
        t += e.n_tokens;
    }
    if (!any && shift_rows_ == 0) return;  // the device rows are 0 already
    // (pageable: the copy has read the rows when it returns; on the step's
    // stream, behind the step in flight that reads the rows before)
    EHC_CHECK(cudaMemcpyAsync(d_shifts_.get(), shifts_.data(), shifts_.size() * sizeof(MropePositions::Shift),
                              cudaMemcpyHostToDevice, stream()));
    shift_rows_ = any ? size_t(total) : 0;
}

void Batch::shift_mrope(const ehcuda::StepView& v, Rank& r) {
    if (!c_.mrope.active()) return;
    const Config& rc = *r.c;
    MropeShiftArgs a;
    a.qkv = r.qkv.as<float>();
    a.ld = rc.qkv_dim();
    a.n_head = rc.n_head;
    a.n_kv = rc.n_kv;
    a.head_dim = rc.head_dim;
    a.n_rot = rc.n_rot;
    a.freq_base = rc.freq_base;
    a.sections[0] = int(c_.mrope.n[0]);
    a.sections[1] = int(c_.mrope.n[0] + c_.mrope.n[1]);
    a.d_shift = d_shifts_.as<int32_t>();
    a.ntok = v.ntok;
    mrope_shift(a, r.stream);
}

std::unique_ptr<ehcuda::CudaSeq> Batch::fork(const ehcuda::CudaSeq& src, uint32_t n_tokens) {
    auto s = BatchBase::fork(src, n_tokens);
    mrope_.fork(&src, s.get(), n_tokens);
    return s;
}

std::unique_ptr<ehcuda::ParkedKv> Batch::park(const ehcuda::CudaSeq& seq, uint32_t n_tokens, uint64_t max_bytes,
                                              uint64_t* out_bytes) {
    auto p = BatchBase::park(seq, n_tokens, max_bytes, out_bytes);
    mrope_.park(&seq, n_tokens, p.get());
    return p;
}

std::unique_ptr<ehcuda::CudaSeq> Batch::unpark(const ehcuda::ParkedKv* parked, const int32_t* tokens,
                                               uint32_t n_tokens) {
    auto s = BatchBase::unpark(parked, tokens, n_tokens);
    mrope_.unpark(parked, s.get());
    return s;
}

}  // namespace llama_cuda
