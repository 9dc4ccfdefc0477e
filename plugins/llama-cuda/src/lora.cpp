#include "lora.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_fp16.h>

#include <engine_host/lora_adapter.hpp>
#include <engine_host/model_source.hpp>
#include <engine_host/plugin_abi.hpp>

#include <ehcuda/check.hpp>

namespace llama_cuda {
namespace {

using ehp::Error;

// Where a site's update lands: the input width, and the output columns
// [col0, col0 + n_out) of the matmul's output rows. n_out 0: the model has
// no such matrix (fused q/k/v, fused gate|up).
struct SiteShape {
    int n_in = 0, n_out = 0, col0 = 0;
};

SiteShape site_shape(const Model& m, int layer, int kind) {
    const Config& c = m.cfg;
    const Layer& L = m.layers[size_t(layer)];
    auto seg = [](const ehcuda::MatSeg& s, int n_in) { return SiteShape{n_in, s.w.rows, s.out_offset}; };
    switch (kind) {
    case kLoraQ: return seg(L.qkv[0], c.n_embd);
    case kLoraK: return L.n_qkv == 3 ? seg(L.qkv[1], c.n_embd) : SiteShape{};
    case kLoraV: return L.n_qkv == 3 ? seg(L.qkv[2], c.n_embd) : SiteShape{};
    case kLoraOut: return SiteShape{c.q_dim(), c.n_embd, 0};
    case kLoraGate: return SiteShape{c.n_embd, L.n_gate_up == 2 ? c.n_ff : 2 * c.n_ff, 0};
    case kLoraUp: return L.n_gate_up == 2 ? SiteShape{c.n_embd, c.n_ff, c.n_ff} : SiteShape{};
    case kLoraDown: return SiteShape{c.n_ff, c.n_embd, 0};
    default: return SiteShape{};
    }
}

SiteShape head_shape(const Config& c) { return SiteShape{c.n_embd, c.n_vocab, 0}; }

// The site a base weight's name binds to, or -1.
int site_of(const Model& m, const std::string& name) {
    const Config& c = m.cfg;
    if (name == "output.weight") return lora_head_site(c);
    int layer = -1, used = 0;
    char kind[32] = {};
    if (std::sscanf(name.c_str(), "blk.%d.%31[a-z_].weight%n", &layer, kind, &used) != 2 || used != int(name.size()) ||
        layer < 0 || layer >= c.n_layer)
        return -1;
    const Layer& L = m.layers[size_t(layer)];
    const std::string k(kind);
    if (k == "attn_qkv" && L.n_qkv == 1) return lora_site(layer, kLoraQ);
    if (k == "attn_q" && L.n_qkv == 3) return lora_site(layer, kLoraQ);
    if (k == "attn_k" && L.n_qkv == 3) return lora_site(layer, kLoraK);
    if (k == "attn_v" && L.n_qkv == 3) return lora_site(layer, kLoraV);
    if (k == "attn_output") return lora_site(layer, kLoraOut);
    if (k == "ffn_gate" && L.n_gate_up == 2) return lora_site(layer, kLoraGate);
    if (k == "ffn_up") return lora_site(layer, L.n_gate_up == 2 ? kLoraUp : kLoraGate);
    if (k == "ffn_down") return lora_site(layer, kLoraDown);
    return -1;
}

SiteShape shape_of_site(const Model& m, int site) {
    if (site == lora_head_site(m.cfg)) return head_shape(m.cfg);
    return site_shape(m, site / kLoraPerLayer, site % kLoraPerLayer);
}

}  // namespace

std::unique_ptr<ehcuda::LoraAdapter> load_adapter(Model& m, const eh_adapter_params& p) {
    if (!p.view) throw Error(EH_INVALID_ARGUMENT, "adapter_load: the adapter view is NULL");
    if (!std::isfinite(p.scale) || p.scale < -1e6f || p.scale > 1e6f)
        throw Error(EH_INVALID_ARGUMENT, "adapter_load: scale must be a finite number in [-1e6, 1e6]");
    if (!(p.alpha >= 0.0f && p.alpha <= 1e6f))
        throw Error(EH_INVALID_ARGUMENT, "adapter_load: alpha must be a finite number in [0, 1e6]");
    if (m.tp > 1)
        throw Error(EH_UNSUPPORTED, "LoRA adapter: llama-cuda does not apply adapters to a tensor-parallel load (" +
                                        std::to_string(m.tp) + " ranks); load the model on one device");
    if (!m.view) throw Error(EH_INTERNAL, "adapter_load: the model keeps no view");
    const Config& c = m.cfg;
    const ehp::LoraAdapterInfo info = ehp::read_lora_adapter(*p.view, *m.view);
    // A llama from a Hugging Face directory keeps q/k rows in HF order; the
    // adapter file's lora_b rows are in the GGUF converter's (each head's
    // rotation pairs interleaved), so they go back: HF row h*hd + j*hd/2 + i
    // is GGUF row h*hd + 2i + j.
    const bool hf_rows = c.arch == "llama" && ehp::from_safetensors(ehp::ModelView(m.view));

    struct Bound {
        int site;
        std::vector<__half> a, bt;
        int rank;
        float scale;
    };
    std::vector<Bound> bound;
    size_t halves = 0;
    for (const ehp::LoraPair& pr : info.pairs) {
        const int site = site_of(m, pr.base);
        const SiteShape sh = site < 0 ? SiteShape{} : shape_of_site(m, site);
        if (site < 0 || sh.n_out == 0)
            throw Error(EH_UNSUPPORTED, "LoRA adapter: llama-cuda does not adapt '" + pr.base +
                                            "' (it adapts the attention, feed-forward and output weights)");
        if (uint64_t(sh.n_in) != pr.n_in || uint64_t(sh.n_out) != pr.n_out)
            throw Error(EH_MODEL_LOAD_FAILED, "LoRA adapter: '" + pr.base + "' is {" + std::to_string(pr.n_in) + ", " +
                                                  std::to_string(pr.n_out) + "}; the loaded matrix is {" +
                                                  std::to_string(sh.n_in) + ", " + std::to_string(sh.n_out) + "}");
        const int r = int(pr.rank);
        if (r > ehcuda::kLoraMaxRank)
            throw Error(EH_MODEL_LOAD_FAILED, "LoRA adapter: '" + pr.base + "': rank " + std::to_string(r) +
                                                  " is above " + std::to_string(ehcuda::kLoraMaxRank));
        const std::vector<float> a = ehcuda::lora_tensor_rows(*pr.a);  // r rows of n_in
        const std::vector<float> b = ehcuda::lora_tensor_rows(*pr.b);  // n_out rows of r
        const bool permute = hf_rows && (pr.base.find(".attn_q.") != std::string::npos ||
                                         pr.base.find(".attn_k.") != std::string::npos);
        const int hd = c.head_dim, n_out = sh.n_out;
        Bound bd{site, std::vector<__half>(a.size()), std::vector<__half>(size_t(r) * n_out), r,
                 p.alpha > 0 ? p.scale * p.alpha / float(r) : p.scale};
        for (size_t i = 0; i < a.size(); ++i) bd.a[i] = __float2half(a[i]);
        for (int o = 0; o < n_out; ++o) {
            int src = o;
            if (permute) {
                const int h = o / hd, within = o % hd, j = within / (hd / 2), i = within % (hd / 2);
                src = h * hd + 2 * i + j;
            }
            for (int k = 0; k < r; ++k) bd.bt[size_t(k) * n_out + o] = __float2half(b[size_t(src) * r + k]);
        }
        halves += (bd.a.size() + 7) / 8 * 8 + (bd.bt.size() + 7) / 8 * 8;
        bound.push_back(std::move(bd));
    }

    m.lora.init(lora_sites(c), &m.ledger);
    auto out = std::make_unique<ehcuda::LoraAdapter>(m.lora, m.device);
    out->data = ehcuda::DeviceBuffer(halves * sizeof(__half), &m.ledger);
    std::vector<ehcuda::LoraDesc> table(size_t(lora_sites(c)));
    __half* at = out->data.as<__half>();
    for (const Bound& bd : bound) {
        ehcuda::LoraDesc& d = table[size_t(bd.site)];
        EHC_CHECK(cudaMemcpy(at, bd.a.data(), bd.a.size() * sizeof(__half), cudaMemcpyHostToDevice));
        d.a = at;
        at += (bd.a.size() + 7) / 8 * 8;  // (16-byte aligned pieces)
        EHC_CHECK(cudaMemcpy(at, bd.bt.data(), bd.bt.size() * sizeof(__half), cudaMemcpyHostToDevice));
        d.bt = at;
        at += (bd.bt.size() + 7) / 8 * 8;
        d.rank = bd.rank;
        d.scale = bd.scale;
    }
    m.lora.write(out->slot(), table);
    return out;
}

void LoraStep::apply(const Model& m, std::initializer_list<int> sites, const int32_t* token_slot,
                     const int32_t* row_token, int nrows, const float* x, int ldx, float* y, int ldy,
                     ehcuda::MemoryLedger* ledger, cudaStream_t s, const ehcuda::StepSpan* spans, int nspans,
                     ehcuda::PrefillWorkspace* pw) {
    if (nrows <= 0 || m.lora.n_sites() == 0) return;
    ehcuda::LoraApplyArgs a;
    for (int site : sites) {
        const SiteShape sh = shape_of_site(m, site);
        if (sh.n_out == 0) continue;  // (fused q/k/v, fused gate|up)
        if (a.nparts == ehcuda::kLoraMaxParts) throw Error(EH_INTERNAL, "LoRA step: too many sites in one launch");
        a.part[a.nparts++] = ehcuda::LoraPart{site, sh.col0, sh.n_out};
        a.n_in = sh.n_in;
    }
    if (a.nparts == 0) return;
    const size_t need = size_t(ehcuda::kLoraMaxParts) * kRows * ehcuda::kLoraMaxRank * sizeof(float);
    if (u_.size() < need) u_ = ehcuda::DeviceBuffer(need, ledger);
    a.table = m.lora.table();
    a.n_sites = m.lora.n_sites();
    a.ldx = ldx;
    a.ldy = ldy;
    a.u = u_.as<float>();
    a.u_rows = kRows;
    // Rows first .. end - 1 through the per-row kernels.
    auto rows = [&](int first, int end) {
        for (int r0 = first; r0 < end; r0 += kRows) {
            a.nrows = std::min(kRows, end - r0);
            a.token_slot = row_token ? token_slot : token_slot + r0;
            a.row_token = row_token ? row_token + r0 : nullptr;
            a.x = x + size_t(r0) * ldx;
            a.y = y + size_t(r0) * ldy;
            ehcuda::lora_apply(a, s);
        }
    };
    // A long entry of one adapter through cuBLAS (its rows are tokens:
    // only where row r is token r), the rest between them per row.
    int done = 0;
    for (int i = 0; !row_token && pw && i < nspans; ++i) {
        const ehcuda::StepSpan& sp = spans[i];
        if (sp.adapter < 0 || sp.n < kGemmMinRows || sp.first < done || sp.first + sp.n > nrows) continue;
        rows(done, sp.first);
        ehcuda::LoraGemmArgs g;
        g.blas = pw->cublas();
        for (int p = 0; p < a.nparts; ++p) {
            g.desc[p] = m.lora.host(sp.adapter, a.part[p].site);
            g.part[p] = a.part[p];
        }
        g.nparts = a.nparts;
        g.ldx = ldx;
        g.n_in = a.n_in;
        g.ldy = ldy;
        g.xh = pw->act();
        g.uh = reinterpret_cast<__half*>(u_.get());
        const int step = int(std::min<size_t>(kRows, pw->act_halves() / size_t(a.n_in)));
        for (int r0 = sp.first; r0 < sp.first + sp.n; r0 += step) {
            g.rows = std::min(step, sp.first + sp.n - r0);
            g.x = x + size_t(r0) * ldx;
            g.y = y + size_t(r0) * ldy;
            ehcuda::lora_apply_gemm(g, s);
        }
        done = sp.first + sp.n;
    }
    rows(done, nrows);
}

}  // namespace llama_cuda
