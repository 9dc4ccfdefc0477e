#include "batch.hpp"

#include <algorithm>
#include <cmath>

#include <ehcuda/attention_paged.hpp>
#include <ehcuda/kernels.hpp>

namespace llama_cuda {
namespace {

ehcuda::BatchShape shape_of(Model& m) {
    const Config& c = m.cfg;
    ehcuda::BatchShape sh;
    sh.device = m.device;
    sh.ledger = &m.ledger;
    sh.n_vocab = c.n_vocab;
    sh.n_layer = c.n_layer;
    sh.kv_dim = c.kv_dim();
    sh.max_cols = std::max({c.n_embd, c.q_dim(), c.n_ff});
    return sh;
}

// How a step's matmuls run, by its token count n (H200, forged Qwen2.5-0.5B
// and Phi-3-mini Q4_K_M, 64 decode steps of n sequences, ms per step):
//   n = 1      single-token GEMV, RMSNorm folded into its input staging
//   n = 2..8   one single-token GEMV per token: the multi-token GEMV kernels
//              took 2.7 / 4.2 / 7.3 ms (Qwen, n = 2 / 4 / 8) and 14 / 24 /
//              45 ms (Phi-3) against 1.9 / 2.8 / 4.8 and 4.4 / 6.9 / 12.2
//   n >= 9     cuBLAS on slab-dequantized FP16 weights (workspace)
constexpr int kPerTokenGemvMax = 8;

}  // namespace

Batch::Batch(Model& model, const eh_kv_params& params)
    : BatchBase(shape_of(model), params), m_(model), c_(model.cfg) {
    ehcuda::MemoryLedger* L = ledger();
    const size_t T = size_t(max_step_tokens());
    h_ = ehcuda::DeviceBuffer(T * c_.n_embd * 4, L);
    xn_ = ehcuda::DeviceBuffer(T * c_.n_embd * 4, L);
    qkv_ = ehcuda::DeviceBuffer(T * c_.qkv_dim() * 4, L);
    attn_ = ehcuda::DeviceBuffer(T * c_.q_dim() * 4, L);
    ff_ = ehcuda::DeviceBuffer(T * 2 * size_t(c_.n_ff) * 4, L);
    last_ = ehcuda::DeviceBuffer(T * c_.n_embd * 4, L);
    // cuBLAS (the workspace's slab dequantization) from 9 tokens on: the
    // in-kernel WMMA GEMM ran a 64-token decode step 4.5x slower.
    workspace()->set_min_tokens(kPerTokenGemvMax + 1);
    init_pool();
}

void Batch::forward(const ehcuda::StepView& v) {
    cudaStream_t s = stream();
    const Config& c = c_;
    const int T = v.ntok;
    float* h = h_.as<float>();
    float* xn = xn_.as<float>();
    float* qkv = qkv_.as<float>();
    float* attn = attn_.as<float>();
    float* ff = ff_.as<float>();
    ehcuda::PrefillWorkspace* pw = workspace();

    // y (+)= segs . x over the step's n tokens: the weight-streaming GEMV for
    // a few tokens, the tensor-core GEMM (or cuBLAS past the workspace's
    // threshold) for more: each weight is read once per step either way.
    auto matmul = [&](const ehcuda::MatSeg* segs, int nseg, int cols, const float* x, int ldx, ehcuda::XMode mode,
                      float* y, int ldy, bool accumulate, int n, const float* norm_w = nullptr) {
        ehcuda::MatmulArgs m;
        m.norm_w = norm_w;
        m.norm_eps = c.eps;
        for (int k = 0; k < nseg; ++k) m.seg[k] = segs[k];
        m.nseg = nseg;
        m.cols = cols;
        m.x = x;
        m.ldx = ldx;
        m.xmode = mode;
        m.y = y;
        m.ldy = ldy;
        m.accumulate = accumulate;
        m.ntok = n;
        m.prefill = pw;
        if (n > 1 && n <= kPerTokenGemvMax) {
            for (int t = 0; t < n; ++t) {
                ehcuda::MatmulArgs one = m;
                one.ntok = 1;
                one.x = x + size_t(t) * ldx;
                one.y = y + size_t(t) * ldy;
                ehcuda::matmul(one, s);
            }
        } else {
            ehcuda::matmul(m, s);
        }
    };
    // y = segs . RMSNorm(h) * norm_w: folded into the GEMV's input staging
    // for one token, a separate kernel otherwise.
    auto normed_matmul = [&](const ehcuda::MatSeg* segs, int nseg, const float* hin, const float* norm_w, float* y,
                             int ldy, int n) {
        if (n == 1) {
            matmul(segs, nseg, c.n_embd, hin, c.n_embd, ehcuda::XMode::RmsNorm, y, ldy, false, 1, norm_w);
            return;
        }
        ehcuda::rmsnorm(hin, c.n_embd, norm_w, xn, c.n_embd, c.n_embd, n, c.eps, s);
        matmul(segs, nseg, c.n_embd, xn, c.n_embd, ehcuda::XMode::Plain, y, ldy, false, n);
    };
    ehcuda::embed_rows(m_.tok_embd, v.d_tokens, T, h, s);
    for (int li = 0; li < c.n_layer; ++li) {
        const Layer& L = m_.layers[size_t(li)];
        normed_matmul(L.qkv, L.n_qkv, h, L.attn_norm, qkv, c.qkv_dim(), T);
        if (c.qk_norm) ehcuda::head_rmsnorm(qkv, c.qkv_dim(), c.n_head, c.n_kv, c.head_dim, L.q_norm, L.k_norm, T, c.eps, s);

        ehcuda::RopeArgs r = rope_args(m_, qkv, T);
        r.k_cache = k_pool(li);
        r.v_cache = v_pool(li);
        r.d_pos = v.d_pos;
        r.d_rows = v.d_rows;
        ehcuda::rope_store_kv(r, s);

        ehcuda::PagedAttnArgs at;
        at.q = qkv;
        at.ldq = c.qkv_dim();
        at.k_pool = k_pool(li);
        at.v_pool = v_pool(li);
        at.n_head = c.n_head;
        at.n_kv = c.n_kv;
        at.head_dim = c.head_dim;
        at.ntok = T;
        at.d_pos = v.d_pos;
        at.d_table = v.d_table;
        at.tables = v.d_tables;
        at.window = c.window;
        at.scale = 1.0f / std::sqrt(float(c.head_dim));
        at.out = attn;
        at.ldo = c.q_dim();
        ehcuda::attention_paged(at, s);

        ehcuda::MatSeg out{L.attn_out};
        matmul(&out, 1, c.q_dim(), attn, c.q_dim(), ehcuda::XMode::Plain, h, c.n_embd, true, T);

        // One token: gate, up and the SwiGLU in one kernel that leaves the
        // down projection's input quantized (as a session's decode step).
        ehcuda::MatSeg gate, up, down{L.ffn_down};
        gate_up_halves(L, c.n_ff, gate, up);
        if (T == 1 && ehcuda::gate_up_swiglu_supported(gate.w, up.w, L.ffn_down)) {
            ehcuda::GateUpArgs gu;
            gu.gate = gate;
            gu.up = up;
            gu.cols = c.n_embd;
            gu.x = h;
            gu.norm_w = L.ffn_norm;
            gu.norm_eps = c.eps;
            gu.out = ff;
            gu.out_bytes = ff_.size();
            ehcuda::gate_up_swiglu(gu, s);
            matmul(&down, 1, c.n_ff, ff, c.n_ff, ehcuda::XMode::Chunks, h, c.n_embd, true, 1);
        } else {
            normed_matmul(L.gate_up, L.n_gate_up, h, L.ffn_norm, ff, 2 * c.n_ff, T);
            matmul(&down, 1, c.n_ff, ff, 2 * c.n_ff, ehcuda::XMode::SwiGLU, h, c.n_embd, true, T);
        }
    }
    if (v.nout == 0) return;
    // LM head on the tokens that need logits only.
    float* last = last_.as<float>();
    ehcuda::gather_rows(h, c.n_embd, v.d_out_idx, v.nout, c.n_embd, last, s);
    ehcuda::MatSeg head{m_.output};
    normed_matmul(&head, 1, last, m_.output_norm, v.logits, c.n_vocab, v.nout);
}

}  // namespace llama_cuda
