// A step's LoRA updates after one matmul (lora.hpp): long entries of one
// adapter through cuBLAS, the other rows through the kernels (each
// adapter's rows together).
#include <algorithm>
#include <cstdint>

#include "ehcuda/check.hpp"
#include "ehcuda/lora.hpp"

namespace ehcuda {

LoraStep::~LoraStep() {
    if (side_) {
        cudaStreamSynchronize(side_);
        cudaStreamDestroy(side_);
    }
    if (fork_) cudaEventDestroy(fork_);
    if (join_) cudaEventDestroy(join_);
}

bool LoraStep::prepare(const LoraSet& set, const int* sites, int nsites, const float* x, int ldx, MemoryLedger* ledger,
                       bool swiglu, LoraApplyArgs& a) {
    if (set.n_sites() == 0) return false;
    for (int i = 0; i < nsites; ++i) {
        const LoraSite& sh = set.site(sites[i]);
        if (sh.n_out == 0 || !set.used(sites[i])) continue;  // (fused q/k/v, fused gate|up; no adapter's pair)
        if (a.nparts == kLoraMaxParts) throw ehp::Error(EH_INTERNAL, "LoRA step: too many sites in one launch");
        a.part[a.nparts++] = LoraPart{sites[i], sh.col0, sh.n_out};
        a.n_in = sh.n_in;
    }
    if (a.nparts == 0) return false;
    // The adapters with a pair at one of the sites: a block of each kernel
    // apiece (a graph keeps this list; LoraSet::generation grows when it
    // would change).
    for (int slot = 0; slot < kLoraMaxAdapters; ++slot) {
        bool any = false;
        for (int p = 0; p < a.nparts; ++p) any = any || set.host(slot, a.part[p].site).rank > 0;
        if (any) a.slots[a.nslots++] = slot;
    }
    if (a.nslots == 0) return false;
    // (sized for the model's widest input: the same at every step, so the
    // buffer a graph captured stays)
    const int room = kLoraMaxParts * lora_slices(set.max_n_in());
    const size_t need = size_t(room) * kRows * kLoraMaxRank * sizeof(float);
    if (u_.size() < need) u_ = DeviceBuffer(need, ledger);
    a.table = set.table();
    a.n_sites = set.n_sites();
    a.ldx = ldx;
    a.u = u_.as<float>();
    a.u_rows = kRows;
    a.u_slices = room;
    a.slice_cols = lora_slice_cols(a.n_in, a.nparts, room);
    a.slices = (a.n_in + a.slice_cols - 1) / a.slice_cols;
    a.vec = a.n_in % 2 == 0 && ldx % 2 == 0 && reinterpret_cast<uintptr_t>(x) % 8 == 0;
    a.swiglu = swiglu;
    return true;
}

void LoraStep::apply(const LoraSet& set, std::initializer_list<int> sites, const int32_t* token_slot,
                     const int32_t* row_token, int nrows, const float* x, int ldx, float* y, int ldy,
                     MemoryLedger* ledger, cudaStream_t s, const StepSpan* spans, int nspans, PrefillWorkspace* pw,
                     bool swiglu) {
    run(set, sites.begin(), int(sites.size()), token_slot, row_token, nrows, x, ldx, y, ldy, ledger, s, spans, nspans, pw,
        swiglu);
}

void LoraStep::run(const LoraSet& set, const int* sites, int nsites, const int32_t* token_slot,
                   const int32_t* row_token, int nrows, const float* x, int ldx, float* y, int ldy,
                   MemoryLedger* ledger, cudaStream_t s, const StepSpan* spans, int nspans, PrefillWorkspace* pw,
                   bool swiglu) {
    LoraApplyArgs a;
    if (nrows <= 0 || !prepare(set, sites, nsites, x, ldx, ledger, swiglu, a)) return;
    a.ldy = ldy;
    // Rows first .. end - 1 through the kernels.
    auto rows = [&](int first, int end) {
        for (int r0 = first; r0 < end; r0 += kRows) {
            a.nrows = std::min(kRows, end - r0);
            a.token_slot = row_token ? token_slot : token_slot + r0;
            a.row_token = row_token ? row_token + r0 : nullptr;
            a.x = x + size_t(r0) * ldx;
            a.y = y + size_t(r0) * ldy;
            lora_apply(a, s);
        }
    };
    // A long entry of one adapter through cuBLAS (its rows are tokens:
    // only where row r is token r), the rest between them per row.
    int done = 0;
    for (int i = 0; !row_token && pw && i < nspans; ++i) {
        const StepSpan& sp = spans[i];
        if (sp.adapter < 0 || sp.n < kGemmMinRows || sp.first < done || sp.first + sp.n > nrows) continue;
        const int step = int(std::min<size_t>(kRows, pw->act_halves() / size_t(a.n_in)));
        if (step < 1) continue;  // (no room for a row of this input: the kernels take it)
        rows(done, sp.first);
        LoraGemmArgs g;
        g.blas = pw->cublas();
        for (int p = 0; p < a.nparts; ++p) {
            g.desc[p] = set.host(sp.adapter, a.part[p].site);
            g.part[p] = a.part[p];
        }
        g.nparts = a.nparts;
        g.ldx = ldx;
        g.n_in = a.n_in;
        g.swiglu = swiglu;
        g.ldy = ldy;
        g.xh = pw->act();
        g.uh = reinterpret_cast<__half*>(u_.get());
        for (int r0 = sp.first; r0 < sp.first + sp.n; r0 += step) {
            g.rows = std::min(step, sp.first + sp.n - r0);
            g.x = x + size_t(r0) * ldx;
            g.y = y + size_t(r0) * ldy;
            lora_apply_gemm(g, s);
        }
        done = sp.first + sp.n;
    }
    rows(done, nrows);
}

void LoraStep::begin(const LoraSet& set, std::initializer_list<int> sites, const int32_t* token_slot, int nrows,
                     const float* x, int ldx, MemoryLedger* ledger, cudaStream_t s, const StepSpan* spans, int nspans,
                     PrefillWorkspace* pw, bool swiglu) {
    if (pending_.active) throw ehp::Error(EH_INTERNAL, "LoRA step: begin() twice without finish()");
    if (int(sites.size()) > kLoraMaxParts) throw ehp::Error(EH_INTERNAL, "LoRA step: too many sites in one launch");
    Pending& q = pending_;
    q = Pending{};
    q.active = true;
    q.set = &set;
    for (int site : sites) q.sites[q.nsites++] = site;
    q.token_slot = token_slot;
    q.nrows = nrows;
    q.x = x;
    q.ldx = ldx;
    q.ledger = ledger;
    q.spans = spans;
    q.nspans = nspans;
    q.pw = pw;
    q.swiglu = swiglu;
    // Split only where run() would make one launch pair: no more than kRows
    // rows and no entry for cuBLAS.
    bool gemm = false;
    for (int i = 0; pw && i < nspans; ++i) gemm = gemm || (spans[i].adapter >= 0 && spans[i].n >= kGemmMinRows);
    if (nrows <= 0 || nrows > kRows || gemm || !prepare(set, q.sites, q.nsites, x, ldx, ledger, swiglu, q.a)) return;
    q.split = true;
    q.a.nrows = nrows;
    q.a.token_slot = token_slot;
    q.a.x = x;
    if (!side_) {  // (the first step with an adapter runs eagerly: never inside a capture)
        EHC_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
        EHC_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
        EHC_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
    }
    EHC_CHECK(cudaEventRecord(fork_, s));
    EHC_CHECK(cudaStreamWaitEvent(side_, fork_, 0));
    lora_shrink(q.a, side_);
    EHC_CHECK(cudaEventRecord(join_, side_));
}

void LoraStep::finish(float* y, int ldy, cudaStream_t s) {
    Pending& q = pending_;
    if (!q.active) throw ehp::Error(EH_INTERNAL, "LoRA step: finish() without begin()");
    q.active = false;
    if (!q.split) {
        run(*q.set, q.sites, q.nsites, q.token_slot, nullptr, q.nrows, q.x, q.ldx, y, ldy, q.ledger, s, q.spans, q.nspans,
            q.pw, q.swiglu);
        return;
    }
    EHC_CHECK(cudaStreamWaitEvent(s, join_, 0));
    q.a.y = y;
    q.a.ldy = ldy;
    lora_expand(q.a, s);
}

}  // namespace ehcuda
