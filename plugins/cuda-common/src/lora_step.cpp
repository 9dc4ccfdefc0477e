// A step's LoRA updates after one matmul (lora.hpp): long entries of one
// adapter through cuBLAS, every other row through the per-row kernels.
#include <algorithm>
#include <cstdint>

#include "ehcuda/lora.hpp"

namespace ehcuda {

void LoraStep::apply(const LoraSet& set, std::initializer_list<int> sites, const int32_t* token_slot,
                     const int32_t* row_token, int nrows, const float* x, int ldx, float* y, int ldy,
                     MemoryLedger* ledger, cudaStream_t s, const StepSpan* spans, int nspans, PrefillWorkspace* pw) {
    if (nrows <= 0 || set.n_sites() == 0) return;
    LoraApplyArgs a;
    for (int site : sites) {
        const LoraSite& sh = set.site(site);
        if (sh.n_out == 0 || !set.used(site)) continue;  // (fused q/k/v, fused gate|up; no adapter's pair)
        if (a.nparts == kLoraMaxParts) throw ehp::Error(EH_INTERNAL, "LoRA step: too many sites in one launch");
        a.part[a.nparts++] = LoraPart{site, sh.col0, sh.n_out};
        a.n_in = sh.n_in;
    }
    if (a.nparts == 0) return;
    // (sized for the model's widest input: the same at every step, so the
    // buffer a graph captured stays)
    const size_t need = size_t(kLoraMaxParts) * size_t(lora_slices(set.max_n_in())) * kRows * kLoraMaxRank * sizeof(float);
    if (u_.size() < need) u_ = DeviceBuffer(need, ledger);
    a.table = set.table();
    a.n_sites = set.n_sites();
    a.ldx = ldx;
    a.ldy = ldy;
    a.u = u_.as<float>();
    a.u_rows = kRows;
    a.slices = lora_slices(a.n_in);
    a.vec = a.n_in % 2 == 0 && ldx % 2 == 0 && reinterpret_cast<uintptr_t>(x) % 8 == 0;
    // Rows first .. end - 1 through the per-row kernels.
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
        if (step < 1) continue;  // (no room for a row of this input: the per-row kernels take it)
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

}  // namespace ehcuda
