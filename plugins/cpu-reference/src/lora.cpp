#include "lora.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include <engine_host/lora_adapter.hpp>
#include <engine_host/plugin_abi.hpp>
#include <engine_host/quant_blocks.hpp>

namespace cpuref {
namespace {

using ehp::Error;

// The matrices a forward pass can adapt: every dense 2-D weight it applies
// with one matmul over all its rows.
std::vector<const Matrix*> adaptable(const Model& m) {
    std::vector<const Matrix*> out;
    for (const Layer& L : m.layers())
        for (const Matrix* w : {&L.wq, &L.wk, &L.wv, &L.wqkv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
            if (*w) out.push_back(w);
    out.push_back(&m.output());
    return out;
}

Matrix bind(const eh_tensor& t) {
    Matrix m;
    m.name = std::string(ehp::to_sv(t.name));
    m.type = t.type;
    m.cols = t.dims[0];
    m.rows = t.dims[1];
    m.phys_rows = m.rows;
    m.row_bytes = ehp::quant::row_bytes(t.type, m.cols);
    if (m.row_bytes == 0 || t.nbytes < m.row_bytes * m.rows || !t.data)
        throw Error(EH_MODEL_LOAD_FAILED, "LoRA adapter: tensor '" + m.name + "' holds fewer bytes than its shape needs");
    m.data = static_cast<const uint8_t*>(t.data);
    return m;
}

}  // namespace

Adapter::Adapter(const Model& model, const eh_adapter_params& params) : model_(model) {
    if (!params.view) throw Error(EH_INVALID_ARGUMENT, "adapter_load: the adapter view is NULL");
    if (!(params.scale == params.scale) || params.scale < -1e6f || params.scale > 1e6f)
        throw Error(EH_INVALID_ARGUMENT, "adapter_load: scale must be a finite number in [-1e6, 1e6]");
    if (!(params.alpha >= 0.0f && params.alpha <= 1e6f))
        throw Error(EH_INVALID_ARGUMENT, "adapter_load: alpha must be a finite number in [0, 1e6]");
    const ehp::LoraAdapterInfo info = ehp::read_lora_adapter(*params.view, *model.view());
    const std::vector<const Matrix*> targets = adaptable(model);
    for (const ehp::LoraPair& p : info.pairs) {
        const Matrix* target = nullptr;
        for (const Matrix* w : targets)
            if (w->name == p.base) target = w;
        if (!target || target->layout != Layout::Rows || target->n_expert != 1 || target->row_step != 1 ||
            target->row_offset != 0 || target->cols != p.n_in || target->rows != p.n_out)
            throw Error(EH_UNSUPPORTED, "LoRA adapter: cpu-reference does not adapt '" + p.base +
                                            "' (it adapts the attention, feed-forward and output weights of a "
                                            "dense GGUF model)");
        // llama.cpp's converter stores a llama's q/k rows (and so lora_b's)
        // permuted for its rotation; a Hugging Face directory keeps them in
        // HF order, which this engine rotates as they are.
        const Config& c = model.config();
        if (c.from_safetensors && c.arch == Arch::Llama &&
            (p.base.find("attn_q.weight") != std::string::npos || p.base.find("attn_k.weight") != std::string::npos))
            throw Error(EH_UNSUPPORTED, "LoRA adapter: '" + p.base + "' of a llama served from a Hugging Face "
                                        "directory: the adapter's rows follow the GGUF layout (permuted for RoPE); "
                                        "serve the model's GGUF");
        LoraPair lp;
        lp.a = bind(*p.a);
        lp.b = bind(*p.b);
        lp.scale = params.alpha > 0 ? params.scale * params.alpha / float(p.rank) : params.scale;
        pairs_.emplace(target, std::move(lp));
    }
}

void lora_update(ThreadPool& pool, const Matrix& w, const Adapter* const* adapters, size_t n, const float* x,
                 size_t x_stride, float* y, size_t y_stride) {
    // Adapters in order of first appearance; each takes its rows in order.
    std::vector<const Adapter*> seen;
    for (size_t t = 0; t < n; ++t)
        if (adapters[t] && std::find(seen.begin(), seen.end(), adapters[t]) == seen.end()) seen.push_back(adapters[t]);
    std::vector<size_t> rows;
    std::vector<float> xin, ax, d;
    for (const Adapter* ad : seen) {
        const LoraPair* p = ad->find(w);
        if (!p) continue;
        rows.clear();
        for (size_t t = 0; t < n; ++t)
            if (adapters[t] == ad) rows.push_back(t);
        const size_t m = rows.size(), n_in = p->a.cols, r = p->a.rows, n_out = p->b.rows;
        xin.resize(m * n_in);
        for (size_t i = 0; i < m; ++i) std::copy_n(x + rows[i] * x_stride, n_in, &xin[i * n_in]);
        ax.resize(m * r);
        matmul(pool, p->a, 0, r, xin.data(), m, n_in, ax.data(), r);
        d.resize(m * n_out);
        matmul(pool, p->b, 0, n_out, ax.data(), m, r, d.data(), n_out);
        for (size_t i = 0; i < m; ++i) {
            float* out = y + rows[i] * y_stride;
            for (size_t j = 0; j < n_out; ++j) out[j] += p->scale * d[i * n_out + j];
        }
    }
}

}  // namespace cpuref
