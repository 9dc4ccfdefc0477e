#include "batch.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

#include <ehcuda/attention_decode_group.hpp>
#include <ehcuda/attention_paged.hpp>
#include <ehcuda/check.hpp>
#include <ehcuda/device_set.hpp>
#include <ehcuda/gemma_ops.hpp>
#include <ehcuda/kernels.hpp>
#include <ehcuda/kv_accept.hpp>
#include <ehcuda/kv_quant.hpp>
#include <ehcuda/step_attention.hpp>

namespace llama_cuda {
namespace {

ehcuda::BatchShape shape_of(Model& m) {
    const Config& c = m.cfg;
    ehcuda::BatchShape sh = ehcuda::rank_pool_shape(m);
    sh.max_cols = std::max({c.n_embd, c.q_dim(), c.n_ff});
    sh.hidden_dim = c.n_embd;
    return sh;
}

// How a step's matmuls run, by its token count n and the threshold G, the
// plan's batch_gemv_per_token(_mirrored) + 1 (ehcuda::route_step_matmul):
//   n = 1      single-token GEMV, RMSNorm folded into its input staging
//   1 < n <= 8 the bulk GEMV's token groups where they take the matrix (the
//              plan's bulk_max_tokens; each weight read once for the group,
//              each token's sums a single-token launch's), else as below
//   1 < n < G  one single-token GEMV per token, the tokens overlapping on
//              side streams (BatchBase::per_token): the multi-token GEMV
//              kernels took 2.7 / 4.2 / 7.3 ms (Qwen, n = 2 / 4 / 8) and 14 /
//              24 / 45 ms (Phi-3) against 1.9 / 2.8 / 4.8 and 4.4 / 6.9 / 12.2
//              (H200, forged Q4_K_M files, ms per step)
//   n >= G     one cuBLAS GEMM per matrix: on the model's FP16 mirror when it
//              keeps one (G = 3 by default then; model.cpp has the sweep),
//              else on slab-dequantized weights (G = 9)

}  // namespace

Batch::Batch(Model& model, const eh_kv_params& params)
    : BatchBase(shape_of(model), params), m_(model), c_(model.cfg) {
    ehcuda::MemoryLedger* L = ledger();
    const size_t T = size_t(max_step_tokens());
    h_ = ehcuda::DeviceBuffer(T * c_.n_embd * 4, L);
    xn_ = ehcuda::DeviceBuffer(T * c_.n_embd * 4, L);
    last_ = ehcuda::DeviceBuffer(T * c_.n_embd * 4, L);
    fused_attn_ = ehcuda::attention_head_dim_fast(c_.head_dim);
    {
        const Config& rc = m_.tp == 1 ? m_.cfg : m_.shards[0].c;
        ehcuda::PagedAttnArgs probe;
        probe.q = probe.out = reinterpret_cast<float*>(16);
        probe.k_pool = probe.v_pool = reinterpret_cast<__half*>(16);
        probe.d_pos = probe.d_table = probe.tables = reinterpret_cast<const int32_t*>(16);
        probe.n_head = rc.n_head;
        probe.n_kv = rc.n_kv;
        probe.head_dim = rc.head_dim;
        probe.ldq = rc.qkv_dim();
        probe.ldo = rc.q_dim();
        probe.ntok = 1;
        group_attn_ = fused_attn_ && ehcuda::attention_decode_group_takes(probe);
    }
    // The LM head's lane (and every rank's at tp 1): the step's stream,
    // workspace and rows.
    head_.step_lane(m_.device, stream(), &m_.cfg, h_.as<float>(), xn_.as<float>(), workspace());
    if (m_.rank_streams)
        group_ = ehcuda::make_rank_group("llama-cuda", ehcuda::shard_devices(m_.shards), m_.device, T * c_.n_embd,
                                         m_.plan.allreduce_signals, m_.plan.allreduce_nccl_min_floats, L, &signals_);
    const int step_gemm_min = ehcuda::step_per_token_max(m_.plan, m_.mirrored) + 1;
    ranks_.resize(size_t(m_.tp));
    for (int i = 0; i < m_.tp; ++i) {
        Rank& r = ranks_[size_t(i)];
        const Shard* sh = r.place(m_, i, group_.get(), stream(), h_.as<float>(), xn_.as<float>(), T * c_.n_embd * 4,
                                  workspace(), L);
        const Config& rc = *r.c;
        if (sh)
            r.own_shard(sh->mirror, max_step_tokens(), std::max({c_.n_embd, rc.q_dim(), rc.n_ff}), step_gemm_min, !group_,
                        T * c_.n_embd * 4, L);
        r.qkv = ehcuda::DeviceBuffer(T * rc.qkv_dim() * 4, L);
        r.attn = ehcuda::DeviceBuffer(T * rc.q_dim() * 4, L);
        r.ff = ehcuda::DeviceBuffer(T * 2 * size_t(rc.n_ff) * 4, L);
        // Decode-only steps: the fused paged attention, with split scratch for
        // the widest such step and (one row) its output quantized for attn_out.
        if (fused_attn_) r.decode_scratch(max_step_entries(), max_seq_tokens(), L);
    }
    rows_.bind(group_.get(), ranks_);
    EHC_CHECK(cudaSetDevice(m_.device));
    // cuBLAS from G tokens on (above); the in-kernel WMMA GEMM ran a 64-token
    // decode step 4.5x slower than cuBLAS on slabs.
    workspace()->set_min_tokens(step_gemm_min);
    workspace()->set_mirror(&m_.mirror);
    if (c_.mrope.active()) {
        d_shifts_ = ehcuda::DeviceBuffer(T * sizeof(MropePositions::Shift), L);
        EHC_CHECK(cudaMemset(d_shifts_.get(), 0, d_shifts_.size()));
    }
    init_pool();
}

void Batch::accept_kv_type(const Model& m, uint32_t type) {
    ehcuda::accept_quantized_kv("llama-cuda", type, m.cfg.n_kv, m.cfg.head_dim);
    // An image's span attention (batch_images.cpp) reads F16 pools.
    if (m.vision)
        ehp::refuse_kv_type(type, "llama-cuda takes images (an encoder is loaded: --mmproj) with the F16 KV cache only");
}

Batch::~Batch() {
    for (Rank& r : ranks_) {
        cudaSetDevice(r.device);
        if (r.stream) cudaStreamSynchronize(r.stream);
        r.own_pw.reset();
    }
    cudaSetDevice(m_.device);
}

void Batch::decode_attention(const ehcuda::StepView& v, Rank& r, int layer, bool chunks) {
    ehcuda::DecodeAttnArgs da =
        r.decode_attn_args(v, k_pool(pool_layer(r, layer)), v_pool(pool_layer(r, layer)), kv_type(), max_seq_tokens(), chunks);
    da.n_rot = c_.n_rot;
    da.neox = c_.neox;
    da.freq_base = c_.layer_freq_base(layer);
    da.freq_factors = layer_rope_freqs(m_, layer, m_.tp > 1 ? r.index : -1);
    da.window = c_.layer_window(layer);
    if (c_.qk_norm) {  // (Qwen3, Gemma 3: normalised inside the attention, no head_rmsnorm launch)
        da.q_norm = (*r.layers)[size_t(layer)].q_norm;
        da.k_norm = (*r.layers)[size_t(layer)].k_norm;
        da.norm_eps = c_.eps;
    }
    da.scale = c_.scale();
    ehcuda::rope_attention_decode(da, r.stream);
}

void Batch::prefill_attention(const ehcuda::StepView& v, Rank& rk, int layer) {
    const Config& c = *rk.c;
    const int pl = pool_layer(rk, layer);
    float* qkv = rk.qkv.as<float>();
    cudaStream_t s = rk.stream;
    ehcuda::RopeArgs r = rope_args(m_, qkv, v.ntok, layer);
    r.freq_factors = layer_rope_freqs(m_, layer, m_.tp > 1 ? rk.index : -1);
    r.ld = c.qkv_dim();
    r.n_head = c.n_head;
    r.n_kv = c.n_kv;
    r.k_cache = k_pool(pl);
    r.v_cache = v_pool(pl);
    r.d_pos = v.d_pos;
    r.d_rows = v.d_rows;
    r.kv_type = kv_type();
    ehcuda::rope_store_kv(r, s);

    ehcuda::StepAttnArgs at = rk.step_attn_args(k_pool(pl), v_pool(pl), kv_type());
    at.window = c.layer_window(layer);
    at.scale = c.scale();
    // (a deep decode step's rows: each row's query group on the tensor cores)
    at.group = v.deep;
    // an image's tokens see each other (images.hpp)
    at.bidirectional = [this](int i) { return images_.bidirectional(i); };
    at.d_reach = images_.d_reach();
    ehcuda::step_attention(at, v, s);
}

void Batch::forward(const ehcuda::StepView& v) {
    cudaStream_t s = stream();
    const Config& c = c_;
    const int T = v.ntok;
    const int tp = m_.tp;
    float* h = h_.as<float>();
    // A step with LoRA adapters (v.lora; tp 1 only) keeps every adapted
    // matmul's input in memory (no norm folded into a kernel; the SwiGLU
    // the down projection's adapter computes from the gate|up rows as its
    // matmul does) and adds its rows' updates to each output (lora.hpp); any
    // other step launches nothing more.
    // adapt_begin as soon as the matmul's input is there (a decode step's
    // shrink then runs beside the matmul), adapt_end after the matmul.
    const bool lora = v.lora;
    auto adapt_begin = [&](std::initializer_list<int> sites, const float* x, int ldx, int n, bool swiglu = false) {
        if (lora) lora_.begin(m_.lora, sites, v.d_lora, n, x, ldx, ledger(), s, v.spans, v.nspans, workspace(), swiglu);
    };
    auto adapt_end = [&](float* y, int ldy) {
        if (lora) lora_.finish(y, ldy, s);
    };

    // y (+)= segs . x over the step's n tokens, on rank r's stream (r: a
    // rank or the LM head's lane): the weight-streaming GEMV for a few
    // tokens, the tensor-core GEMM (or cuBLAS past the workspace's
    // threshold) for more: each weight is read once per step either way.
    auto matmul = [&](Rank& r, const ehcuda::MatSeg* segs, int nseg, int cols, const float* x, int ldx,
                      ehcuda::XMode mode, float* y, int ldy, bool accumulate, int n, const float* norm_w = nullptr) {
        // (below the workspace's cuBLAS threshold: a call per token)
        r.run_matmul(r.matmul_args(segs, nseg, cols, x, ldx, mode, y, ldy, accumulate, n, norm_w, c.eps),
                     r.pw->min_tokens() - 1, s, [this](int k, auto&& fn) { per_token(k, fn); });
    };
    // y = segs . RMSNorm(hin) * norm_w: folded into the GEMV's input staging
    // for one token, into a token group's quantization where the groups
    // take it (KernelPlan::bulk_group_norm), a separate kernel (into r.xn)
    // otherwise.
    auto normed_matmul = [&](Rank& r, const ehcuda::MatSeg* segs, int nseg, const float* hin, const float* norm_w,
                             float* y, int ldy, int n, const std::function<void()>& after_norm = {}) {
        if (!lora) {
            const ehcuda::MatmulArgs m =
                r.matmul_args(segs, nseg, c.n_embd, hin, c.n_embd, ehcuda::XMode::RmsNorm, y, ldy, false, n, norm_w, c.eps);
            // (one launch either way: matmul's per-token split is for
            // inputs the groups refuse, so this asks them once)
            if (n == 1 || ehcuda::matmul_groups_tokens(m)) {
                ehcuda::matmul(m, r.stream);
                return;
            }
        }
        ehcuda::rmsnorm(hin, c.n_embd, norm_w, r.xn, c.n_embd, c.n_embd, n, c.eps, r.stream);
        if (after_norm) after_norm();
        matmul(r, segs, nseg, c.n_embd, r.xn, c.n_embd, ehcuda::XMode::Plain, y, ldy, false, n);
    };
    // A row-parallel matmul (attn_output, ffn_down) adds into h at tp 1;
    // with ranks each writes its share, and one all-reduce adds their sum
    // into the residual (tp_step.hpp).
    const bool acc = tp == 1;
    auto target = [&](Rank& r) { return rows_.target(r.index); };
    auto all_reduce = [&] {
        rows_.all_reduce(s, size_t(T) * c.n_embd, size_t(m_.plan.allreduce_nccl_min_floats), signals_);
    };
    // Rank r's GPU current for its launches (its own stream's GPU).
    auto use = [&](const Rank& r) {
        if (group_) group_->use(r.index);
    };
    ehcuda::embed_rows(m_.tok_embd, v.d_tokens, T, h, s);
    if (c.embd_scale != 1.0f) ehcuda::scale_floats(h, size_t(T) * c.n_embd, c.embd_scale, s);
    images_.apply(v, h, c.n_embd, s);  // image rows over their tokens, as given (unscaled)
    // Ranks on their own streams start from the embedded rows: rank 0 in
    // place, the others with a copy of their own.
    rows_.fork(s, size_t(T) * c.n_embd);
    // Gemma 3 (tp 1 only): attn_output and ffn_down write xn (free once the
    // QKV and gate|up matmuls have read it), whose norm is then added to h.
    float* post = c.gemma ? ranks_[0].xn : nullptr;
    for (int li = 0; li < c.n_layer; ++li) {
        for (Rank& r : ranks_) {
            use(r);
            const Config& rc = *r.c;
            const Layer& L = (*r.layers)[size_t(li)];
            float* qkv = r.qkv.as<float>();
            float* attn = r.attn.as<float>();
            float* y = post ? post : target(r);
            const bool acc_out = acc && !post;
            normed_matmul(r, L.qkv, L.n_qkv, r.h, L.attn_norm, qkv, rc.qkv_dim(), T, [&] {
                adapt_begin({lora_site(li, kLoraQ), lora_site(li, kLoraK), lora_site(li, kLoraV)}, r.xn, c.n_embd, T);
            });
            adapt_end(qkv, rc.qkv_dim());
            shift_mrope(v, r);  // qwen2vl only

            ehcuda::MatSeg out{L.attn_out};
            bool chunks = false;
            if (v.decode && !v.deep && fused_attn_ &&
                ehcuda::attention_decode_fused_takes(T, rc.n_head, rc.n_kv, rc.head_dim)) {
                // One token: the attention leaves its output quantized for the
                // output projection, which then stages nothing (as a session's
                // decode step).
                chunks = !lora && T == 1 && r.attn_chunks.size() && ehcuda::gemv_takes_chunks(L.attn_out.type);
                decode_attention(v, r, li, chunks);
            } else {
                if (c.qk_norm)
                    ehcuda::head_rmsnorm(qkv, rc.qkv_dim(), rc.n_head, rc.n_kv, rc.head_dim, L.q_norm, L.k_norm, T, c.eps,
                                         r.stream);
                prefill_attention(v, r, li);
            }
            adapt_begin({lora_site(li, kLoraOut)}, attn, rc.q_dim(), T);
            if (chunks)
                matmul(r, &out, 1, rc.q_dim(), r.attn_chunks.as<float>(), rc.q_dim(), ehcuda::XMode::Chunks, y, c.n_embd,
                       acc_out, 1);
            else
                matmul(r, &out, 1, rc.q_dim(), attn, rc.q_dim(), ehcuda::XMode::Plain, y, c.n_embd, acc_out, T);
            adapt_end(y, c.n_embd);
            if (post) ehcuda::rmsnorm_add(h, post, L.post_attn_norm, c.n_embd, T, c.eps, s);
        }
        all_reduce();

        for (Rank& r : ranks_) {
            use(r);
            const Config& rc = *r.c;
            const Layer& L = (*r.layers)[size_t(li)];
            float* ff = r.ff.as<float>();
            // Gemma 3 (post set): its sum goes through the post-norm first.
            float* y = post ? post : target(r);
            const bool acc_down = acc && !post;
            // One token: gate, up and the activation (SwiGLU, Gemma's
            // GeLU(tanh) gate) in one kernel that leaves the down
            // projection's input quantized (as a session's decode step).
            ehcuda::MatSeg gate, up, down{L.ffn_down};
            gate_up_halves(L, rc.n_ff, gate, up);
            if (T == 1 && !lora && ehcuda::gate_up_swiglu_supported(gate.w, up.w, L.ffn_down)) {
                ehcuda::GateUpArgs gu;
                gu.gate = gate;
                gu.up = up;
                gu.cols = c.n_embd;
                gu.x = r.h;
                gu.norm_w = L.ffn_norm;
                gu.norm_eps = c.eps;
                gu.out = ff;
                gu.out_bytes = r.ff.size();
                if (c.gemma) ehcuda::gate_up_geglu(gu, r.stream);
                else ehcuda::gate_up_swiglu(gu, r.stream);
                matmul(r, &down, 1, rc.n_ff, ff, rc.n_ff, ehcuda::XMode::Chunks, y, c.n_embd, acc_down, 1);
            } else {
                normed_matmul(r, L.gate_up, L.n_gate_up, r.h, L.ffn_norm, ff, 2 * rc.n_ff, T,
                              [&] { adapt_begin({lora_site(li, kLoraGate), lora_site(li, kLoraUp)}, r.xn, c.n_embd, T); });
                adapt_end(ff, 2 * rc.n_ff);
                // Gemma's activation in place; SwiGLU folded into the down
                // projection's input (and its adapter's).
                if (c.gemma) ehcuda::geglu_tanh(ff, 2 * rc.n_ff, rc.n_ff, T, r.stream);
                const ehcuda::XMode mode = c.gemma ? ehcuda::XMode::Plain : ehcuda::XMode::SwiGLU;
                adapt_begin({lora_site(li, kLoraDown)}, ff, 2 * rc.n_ff, T, !c.gemma);
                matmul(r, &down, 1, rc.n_ff, ff, 2 * rc.n_ff, mode, y, c.n_embd, acc_down, T);
                adapt_end(y, c.n_embd);
            }
            if (post) ehcuda::rmsnorm_add(h, post, L.post_ffn_norm, c.n_embd, T, c.eps, s);
        }
        all_reduce();
    }
    // Rank 0's rows (h) hold the whole residual; the LM head and the
    // sampler run on the step's stream, on rank 0's GPU.
    if (group_) group_->join(s);
    // The hidden rows asked for (EH_STEP_HIDDEN): the LM head's input, after
    // the output norm.
    if (v.nhid > 0) {
        ehcuda::gather_rows(h, c.n_embd, v.d_hid_idx, v.nhid, c.n_embd, last_.as<float>(), s);
        ehcuda::rmsnorm(last_.as<float>(), c.n_embd, m_.output_norm, v.hidden, c.n_embd, c.n_embd, v.nhid, c.eps, s);
    }
    if (v.nout == 0) return;
    // LM head on the tokens that need logits only (every token's, in order,
    // when each has a row: decode and verify steps read h itself).
    const float* last = h;
    if (v.nout != v.ntok) {
        ehcuda::gather_rows(h, c.n_embd, v.d_out_idx, v.nout, c.n_embd, last_.as<float>(), s);
        last = last_.as<float>();
    }
    ehcuda::MatSeg head{m_.output};
    normed_matmul(head_, &head, 1, last, m_.output_norm, v.logits, c.n_vocab, v.nout);
    if (lora)  // (its rows: the tokens that need logits)
        lora_.apply(m_.lora, {lora_head_site(c)}, v.d_lora, v.nout != v.ntok ? v.d_out_idx : nullptr, v.nout,
                    xn_.as<float>(), c.n_embd, v.logits, c.n_vocab, ledger(), s, v.spans, v.nspans, workspace());
    if (c.logit_softcap > 0.0f) ehcuda::softcap_floats(v.logits, size_t(v.nout) * c.n_vocab, c.logit_softcap, s);
}

}  // namespace llama_cuda
