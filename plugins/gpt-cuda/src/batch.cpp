#include "batch.hpp"
#include "lora.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include <ehcuda/check.hpp>
#include <ehcuda/gpt_ops.hpp>
#include <ehcuda/kernel_route.hpp>
#include <ehcuda/kv_quant.hpp>
#include <ehcuda/kv_quant_store.hpp>
#include <ehcuda/moe.hpp>
#include <ehcuda/moe_invariant.hpp>
#include <ehcuda/step_attention.hpp>

namespace gpt_cuda {
namespace {

// KV precision: the pool is BatchBase's FP16, not the session's default
// FP32. The session keeps FP32 because on the forged gpt-oss-20b FP16 K/V
// flipped near-tied router choices (issue 8: the top-1 token moved at 15
// of 128 positions against the CPU reference). FP16 here anyway: half the
// pool bytes (twice the sequences in a budget) and half the attention
// reads, one pool format for every CUDA plugin (copy-on-write, the
// scratch block, the paged kernel). On the tiny gpt-oss and gpt2 models
// every position stays within 1e-2 of the CPU reference with the same
// top-1 token (tests/cuda/gpt_batch_step_test.cpp).

ehcuda::BatchShape shape_of(Model& m) {
    const Config& c = m.cfg;
    ehcuda::BatchShape sh;
    sh.device = m.device;
    sh.ledger = &m.ledger;
    sh.n_vocab = c.n_vocab;
    sh.n_layer = c.n_layer;
    sh.kv_dim = c.kv_dim();
    // gpt2 has a table of learned positions: no room past its end
    if (c.arch == Arch::Gpt2) sh.seq_cap = uint32_t(c.n_ctx_train);
    sh.max_cols = std::max({c.n_embd, c.q_dim(), c.arch == Arch::Gpt2 ? c.n_ff : 0});
    sh.upload_aside = m.plan.step_upload_aside;
    return sh;
}

// How a step's matmuls run, by its token count n (H200, forged gpt-oss-20b,
// 64 decode steps of n sequences; tests/gpt_cuda/bench_test.cpp
// GptOss20bBatchedStep, tokens/s at n = 16 / 32 / 64):
//   dense:   ehcuda::route_step_matmul (the plan's bulk_max_tokens and
//            batch_gemv_per_token, 8): n = 2..8 the bulk GEMV's token
//            groups (each weight read once for the group) where they take
//            the matrix, else one single-token GEMV per token (n = 2 / 4 / 8
//            gave 271 / 296 / 549 tokens/s against 211 / 235 / 375 with the
//            register kernel's token groups), cuBLAS on slab-dequantized weights from 9 on
//            (per-token GEMVs to 64: 923 / 962 / 973 against 1,094 / 1,288 /
//            1,409). FP16 mirrors do not lower it here.
//   experts: one token: the one-token expert kernel (integer dot products,
//            routing inside). Two or more: the grouped kernels (moe_grouped:
//            pairs grouped by expert on the device, graph-safe, no host
//            synchronisation) in calls of up to moe_grouped_max tokens
//            (model.hpp); they pick the tile form for prefill-sized calls.
//            Experts the grouped kernels do not take: the cuBLAS
//            grouped-by-expert form (moe_prefill, which synchronises the host
//            once a layer) when not captured, else the per-pair kernels.
//   batch_invariant (load option): a token's router logits, routing and
//            expert sums are the same bits whatever else its step holds.
//            The router and the pre-norm: moe_router_rows at every size (the
//            one-token router's per-token arithmetic). The experts: one
//            token, moe_decode_mma (the grouped tensor-core passes'
//            arithmetic without the grouping) where the experts have that
//            form, else the grouped kernels' integer form; more, the grouped
//            kernels in one form (one_form: never the tiles; model.cpp turns
//            off the 64-token MXFP4 pass, which splits K otherwise). The
//            one-token integer kernel's sums differ from the tensor-core
//            form's FP16 ones, and a top-k routing amplifies that
//            difference: without this a Qwen3-MoE sequence decoded among
//            three others parts from its solo tokens (eh-plugin-check
//            batch_invariance). The dense matmuls still switch from the GEMV
//            to cuBLAS at 9 rows, as llama-cuda's do, and the decode
//            attention's split count follows the step's rows
//            (cuda-common/README.md, Determinism).

// Whether batch_invariant's router (moe_router_rows) takes this layer's:
// an F32 router of n_expert x n_embd. (Others keep the GEMV or cuBLAS,
// whose sums change with the step's size.)
bool router_rows(const Model& m, const Layer& L) {
    const ehcuda::WeightRef& w = L.router.w;
    return w.rows == m.cfg.n_expert && w.cols == m.cfg.n_embd && w.row_bytes == size_t(w.cols) * 4 &&
           ehcuda::moe_router_rows_supported(w.type, m.cfg.n_expert, m.cfg.n_embd);
}

// Tokens per call of the paths besides the grouped kernels (moe_prefill,
// the per-pair kernels): bounds their buffers whatever the step's budget.
constexpr int kMoeChunk = 512;

}  // namespace

Batch::Batch(Model& model, const eh_kv_params& params)
    : BatchBase(shape_of(model), params),
      m_(model),
      c_(model.cfg),
      gemv_per_token_max_(ehcuda::step_per_token_max(model.plan, false)),
      moe_grouped_max_(moe_grouped_max(model)) {
    ehcuda::MemoryLedger* L = ledger();
    const size_t T = size_t(max_step_tokens());
    h_ = ehcuda::DeviceBuffer(T * c_.n_embd * 4, L);
    xn_ = ehcuda::DeviceBuffer(T * c_.n_embd * 4, L);
    qkv_ = ehcuda::DeviceBuffer(T * c_.qkv_dim() * 4, L);
    attn_ = ehcuda::DeviceBuffer(T * c_.q_dim() * 4, L);
    last_ = ehcuda::DeviceBuffer(T * c_.n_embd * 4, L);
    if (c_.arch == Arch::Gpt2) {
        ff_ = ehcuda::DeviceBuffer(T * c_.n_ff * 4, L);
    } else {
        const size_t K = size_t(c_.n_expert_used), chunk = std::min<size_t>(T, kMoeChunk);
        ff_ = ehcuda::DeviceBuffer(
            std::max(chunk * K * c_.n_ff_exp * 4, ehcuda::moe_decode_scratch_bytes(int(K), c_.n_ff_exp)), L);
        router_ = ehcuda::DeviceBuffer(T * c_.n_expert * 4, L);
        // moe_router_decode's counter, then moe_decode_mma's
        router_counter_ = ehcuda::DeviceBuffer(4 * size_t(1 + ehcuda::moe_decode_mma_counters(c_.n_embd)), L);
        EHC_CHECK(cudaMemset(router_counter_.get(), 0, router_counter_.size()));
        if (moe_grouped_max_ >= 2)
            grouped_ = ehcuda::DeviceBuffer(ehcuda::moe_grouped_scratch_bytes(int(std::min<size_t>(T, size_t(moe_grouped_max_))),
                                                                               int(K), c_.n_expert, c_.n_embd, c_.n_ff_exp), L);
        ids_ = ehcuda::DeviceBuffer(T * K * 4, L);
        wts_ = ehcuda::DeviceBuffer(T * K * 4, L);
        // The cuBLAS form's workspace only where some layer's experts need it.
        bool all_grouped = moe_grouped_max_ >= 2;
        for (const Layer& ly : m_.layers)
            all_grouped = all_grouped && ehcuda::moe_grouped_supported(ly.gate_exps, ly.up_exps, ly.down_exps, int(K));
        if (!all_grouped) {
            ehcuda::PrefillShape ps;
            ps.max_tokens = int(chunk);
            ps.max_cols = c_.n_embd;
            ps.moe_experts = c_.n_expert;
            ps.moe_k = c_.n_expert_used;
            ps.moe_embd = c_.n_embd;
            ps.moe_ff = c_.n_ff_exp;
            moe_ws_ = std::make_unique<ehcuda::PrefillWorkspace>(ps, stream(), L);
        }
    }
    if (c_.arch != Arch::Gpt2 && ehcuda::attention_head_dim_fast(c_.head_dim)) {
        size_t heads_x_splits = 0;
        for (int r = 1; r <= max_step_entries(); ++r)
            heads_x_splits = std::max(heads_x_splits, size_t(r) * c_.n_head * decode_splits(r));
        attn_scratch_ = ehcuda::DeviceBuffer(heads_x_splits * (c_.head_dim + 2) * 4, L);
        attn_counters_ = ehcuda::DeviceBuffer(ehcuda::attention_decode_counters(c_.n_head, max_step_entries()) * 4, L);
        EHC_CHECK(cudaMemset(attn_counters_.get(), 0, attn_counters_.size()));
        if (const size_t n = ehcuda::gemv_chunk_bytes(c_.q_dim())) attn_chunks_ = ehcuda::DeviceBuffer(n, L);
    }
    workspace()->set_min_tokens(gemv_per_token_max_ + 1);
    workspace()->set_mirror(&m_.mirror);
    init_pool();
}

Batch::~Batch() { cudaStreamSynchronize(stream()); }

void Batch::accept_kv_type(const Model& m, uint32_t type) {
    if (!ehcuda::kv_type_quantized(type))
        ehp::refuse_kv_type(type, "gpt-cuda stores F16 (its default), Q8_0 or FP8_E4M3");
    // (a tensor-parallel rank's row, kv_dim / ranks, is BatchBase's check)
    const int hd = m.cfg.head_dim, kv_dim = m.cfg.kv_dim();
    if (kv_dim % ehcuda::kKvQuantBlock != 0 || hd > ehcuda::kAttentionMaxHeadDim)
        ehp::refuse_kv_type(type, "a K/V row of " + std::to_string(kv_dim) + " values (" + std::to_string(m.cfg.n_kv) +
                                      " heads of " + std::to_string(hd) +
                                      ") is not a whole number of 32-value blocks, or its heads are over 256");
}

void Batch::matmul(const ehcuda::MatSeg* segs, int nseg, int cols, const float* x, int ldx, ehcuda::XMode mode,
                   float* y, int ldy, bool accumulate, int n, const float* norm_w) {
    ehcuda::MatmulArgs m;
    m.norm_w = norm_w;
    m.norm_eps = c_.eps;
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
    m.prefill = workspace();
    if (n > 1 && n <= gemv_per_token_max_ && !ehcuda::matmul_groups_tokens(m)) {
        per_token(n, [&](int t, cudaStream_t st) {
            ehcuda::MatmulArgs one = m;
            one.ntok = 1;
            one.x = x + size_t(t) * ldx;
            one.y = y + size_t(t) * ldy;
            ehcuda::matmul(one, st);
        });
    } else {
        ehcuda::matmul(m, stream());
    }
}

void Batch::normed_matmul(const ehcuda::MatSeg* segs, int nseg, const float* x, const float* norm_w, float* y,
                          int ldy, int n, bool fold) {
    const int E = c_.n_embd;
    if (fold) {
        matmul(segs, nseg, E, x, E, ehcuda::XMode::RmsNorm, y, ldy, false, 1, norm_w);
        return;
    }
    ehcuda::rmsnorm(x, E, norm_w, xn_.as<float>(), E, E, n, c_.eps, stream());
    matmul(segs, nseg, E, xn_.as<float>(), E, ehcuda::XMode::Plain, y, ldy, false, n);
}

int Batch::decode_splits(int rows) const {
    return ehcuda::attention_decode_row_splits(max_seq_tokens(), c_.n_head, rows);
}

bool Batch::attend(int li, const ehcuda::StepView& v, int n_rot, int window, const float* sinks,
                   const ehcuda::MatSeg& attn_out, const float* q_norm, const float* k_norm) {
    cudaStream_t s = stream();
    const Config& c = c_;
    float* qkv = qkv_.as<float>();
    const float scale = 1.0f / std::sqrt(float(c.head_dim));
    if (v.decode && n_rot > 0 && attn_scratch_.size() &&
        ehcuda::attention_decode_fused_takes(v.ntok, c.n_head, c.n_kv, c.head_dim)) {
        // Decode rows: RoPE, the K/V store, split-K attention (with the
        // sinks, gpt-oss) in one launch (the session's decode attention, paged).
        ehcuda::DecodeAttnArgs da;
        da.qkv = qkv;
        da.n_head = c.n_head;
        da.n_kv = c.n_kv;
        da.head_dim = c.head_dim;
        da.n_rot = n_rot;
        da.neox = true;
        da.inv_freq = m_.inv_freq;
        da.attn_factor = c.attn_factor;
        da.sinks = sinks;
        da.q_norm = q_norm;
        da.k_norm = k_norm;
        da.norm_eps = c.eps;
        da.k_cache = k_pool(li);
        da.v_cache = v_pool(li);
        da.kv_type = kv_type();
        da.window = window;
        da.scale = scale;
        da.out = attn_.as<float>();
        da.nsplit = decode_splits(v.ntok);
        da.scratch = attn_scratch_.as<float>();
        da.counters = attn_counters_.as<uint32_t>();
        const bool chunks = v.ntok == 1 && !v.lora && attn_chunks_.size() && ehcuda::gemv_takes_chunks(attn_out.w.type);
        if (chunks) da.out_chunks = attn_chunks_.get();
        da.paged = true;
        da.nrows = v.ntok;
        da.ldqkv = c.qkv_dim();
        da.ldo = c.q_dim();
        da.d_pos = v.d_pos;
        da.d_rows = v.d_rows;
        da.d_table = v.d_table;
        da.tables = v.d_tables;
        ehcuda::rope_attention_decode(da, s);
        return chunks;
    }
    if (q_norm) ehcuda::head_rmsnorm(qkv, c.qkv_dim(), c.n_head, c.n_kv, c.head_dim, q_norm, k_norm, v.ntok, c.eps, s);
    ehcuda::RopeTableArgs r;  // NEOX rotation (YaRN-scaled when the file says) from the model's table
    r.qkv = qkv;
    r.ld = c.qkv_dim();
    r.n_head = c.n_head;
    r.n_kv = c.n_kv;
    r.head_dim = c.head_dim;
    r.n_rot = n_rot;
    r.neox = true;
    r.inv_freq = m_.inv_freq;
    r.attn_factor = c.attn_factor;
    r.ntok = v.ntok;
    r.k_cache = k_pool(li);
    r.v_cache = v_pool(li);
    r.d_pos = v.d_pos;
    r.d_rows = v.d_rows;
    if (kv_type() != EH_TYPE_F16) ehcuda::rope_table_store_kv_quant(r, kv_type(), s);
    else ehcuda::rope_table_store_kv(r, s);

    // (every step's rows take the query-group kernel where it takes the
    // heads, a key read once per KV head; with the sinks and window)
    ehcuda::StepAttnArgs at;
    at.q = qkv;
    at.ldq = c.qkv_dim();
    at.out = attn_.as<float>();
    at.ldo = c.q_dim();
    at.k_pool = k_pool(li);
    at.v_pool = v_pool(li);
    at.kv_type = kv_type();
    at.n_head = c.n_head;
    at.n_kv = c.n_kv;
    at.head_dim = c.head_dim;
    at.window = window;
    at.sinks = sinks;
    at.scale = scale;
    at.group_scratch = attn_scratch_.as<float>();
    at.group_scratch_floats = attn_scratch_.size() / 4;
    at.pw = workspace();
    ehcuda::step_attention(at, v, s);
    return false;
}

void Batch::gpt2_layer(int li, const ehcuda::StepView& v) {
    cudaStream_t s = stream();
    const Config& c = c_;
    const Layer& L = m_.layers[size_t(li)];
    const int T = v.ntok;
    float* h = h_.as<float>();
    float* xn = xn_.as<float>();
    float* ff = ff_.as<float>();

    ehcuda::layernorm(h, c.n_embd, L.attn_norm, L.attn_norm_b, xn, c.n_embd, c.n_embd, T, c.eps, s);
    matmul(L.qkv, L.n_qkv, c.n_embd, xn, c.n_embd, ehcuda::XMode::Plain, qkv_.as<float>(), c.qkv_dim(), false, T);
    adapt(v, {lora_site(li, kLoraQ), lora_site(li, kLoraK), lora_site(li, kLoraV)}, xn, c.n_embd, qkv_.as<float>(),
          c.qkv_dim(), T);
    attend(li, v, 0, 0, nullptr, L.attn_out);  // (no rotation: stores K and V)
    matmul(&L.attn_out, 1, c.q_dim(), attn_.as<float>(), c.q_dim(), ehcuda::XMode::Plain, h, c.n_embd, true, T);
    adapt(v, {lora_site(li, kLoraOut)}, attn_.as<float>(), c.q_dim(), h, c.n_embd, T);

    ehcuda::layernorm(h, c.n_embd, L.ffn_norm, L.ffn_norm_b, xn, c.n_embd, c.n_embd, T, c.eps, s);
    matmul(&L.ffn_up, 1, c.n_embd, xn, c.n_embd, ehcuda::XMode::Plain, ff, c.n_ff, false, T);
    adapt(v, {lora_site(li, kLoraUp)}, xn, c.n_embd, ff, c.n_ff, T);
    ehcuda::gelu_tanh_inplace(ff, c.n_ff, c.n_ff, T, s);
    matmul(&L.ffn_down, 1, c.n_ff, ff, c.n_ff, ehcuda::XMode::Plain, h, c.n_embd, true, T);
    adapt(v, {lora_site(li, kLoraDown)}, ff, c.n_ff, h, c.n_embd, T);
}

void Batch::moe_layer(int li, const ehcuda::StepView& v) {
    cudaStream_t s = stream();
    const Config& c = c_;
    const Layer& L = m_.layers[size_t(li)];
    const int T = v.ntok;
    float* h = h_.as<float>();
    // One token: the pre-norms fold into the GEMVs' input staging (and the
    // expert kernel's), as in a session's decode step.
    const bool one = T == 1 && !m_.batch_invariant &&
                     ehcuda::moe_decode_supported(L.gate_exps, L.up_exps, L.down_exps, c.n_expert_used);
    normed_matmul(L.qkv, L.n_qkv, h, L.attn_norm, qkv_.as<float>(), c.qkv_dim(), T, T == 1 && !v.lora);
    adapt(v, {lora_site(li, kLoraQ), lora_site(li, kLoraK), lora_site(li, kLoraV)}, xn_.as<float>(), c.n_embd,
          qkv_.as<float>(), c.qkv_dim(), T);
    const float* q_norm = c.qk_norm ? L.q_norm : nullptr;
    const float* k_norm = c.qk_norm ? L.k_norm : nullptr;
    if (attend(li, v, c.n_rot, L.window, L.sinks, L.attn_out, q_norm, k_norm))
        matmul(&L.attn_out, 1, c.q_dim(), attn_chunks_.as<float>(), c.q_dim(), ehcuda::XMode::Chunks, h, c.n_embd, true, 1);
    else
        matmul(&L.attn_out, 1, c.q_dim(), attn_.as<float>(), c.q_dim(), ehcuda::XMode::Plain, h, c.n_embd, true, T);
    adapt(v, {lora_site(li, kLoraOut)}, attn_.as<float>(), c.q_dim(), h, c.n_embd, T);

    if (m_.batch_invariant && router_rows(m_, L)) {
        invariant_moe(li, T);
        return;
    }
    // (one token: the expert kernel reads h, and routes for itself where
    // moe_fused_route says; the router's own kernel where router_decode
    // says, routing too where the expert kernel does not)
    if (one && router_decode(m_, L)) {
        ehcuda::moe_router_decode(router_decode_args(c, L, h, router_.as<float>(),
                                                     moe_fused_route(m_) ? nullptr : ids_.as<int32_t>(), wts_.as<float>(),
                                                     router_counter_.as<int>()),
                                  s);
    } else {
        normed_matmul(&L.router, 1, h, L.ffn_norm, router_.as<float>(), c.n_expert, T, one);
        if (!one || !moe_fused_route(m_))
            ehcuda::moe_route(router_.as<float>(), T, c.n_expert, c.n_expert_used, ids_.as<int32_t>(), wts_.as<float>(), s);
    }
    moe(li, T);
}

// batch_invariant's expert block (see the top of the file): the router and
// pre-norm through moe_router_rows for every T; one token's experts through
// moe_decode_mma (its input, FP16, and its scratch in the grouped
// kernels' scratch, unused by a one-token step), more tokens' grouped.
void Batch::invariant_moe(int li, int T) {
    cudaStream_t s = stream();
    const Config& c = c_;
    const Layer& L = m_.layers[size_t(li)];
    const int k = c.n_expert_used;
    const bool one = T == 1 && ehcuda::moe_decode_mma_supported(L.gate_exps, L.up_exps, L.down_exps, k, c.n_expert);
    char* g = static_cast<char*>(grouped_.get());
    const size_t x16_bytes = (size_t(c.n_embd) * 2 + 255) / 256 * 256;
    ehcuda::MoeRouterRowsArgs ra;
    ra.x = h_.as<float>();
    ra.ldx = c.n_embd;
    ra.ntok = T;
    ra.norm_w = L.ffn_norm;
    ra.norm_eps = c.eps;
    ra.w = static_cast<const float*>(L.router.w.data);
    ra.bias = L.router.bias;
    ra.n_expert = c.n_expert;
    ra.cols = c.n_embd;
    ra.logits = router_.as<float>();
    if (one) ra.xn16 = g;
    else ra.xn = xn_.as<float>();
    ehcuda::moe_router_rows(ra, s);
    if (one) {
        ehcuda::MoeDecodeMmaArgs md;
        md.x16 = g;
        md.k = k;
        md.n_expert = c.n_expert;
        md.logits = router_.as<float>();
        md.ids = ids_.as<int32_t>();
        md.weights = wts_.as<float>();
        md.gate = L.gate_exps;
        md.up = L.up_exps;
        md.down = L.down_exps;
        md.alpha = c.swiglu_alpha;
        md.limit = c.swiglu_limit;
        md.scratch = g + x16_bytes;
        md.scratch_bytes = grouped_.size() - x16_bytes;
        md.counters = router_counter_.as<int>() + 1;
        md.h = h_.as<float>();
        ehcuda::moe_decode_mma(md, s);
        return;
    }
    ehcuda::moe_route(router_.as<float>(), T, c.n_expert, k, ids_.as<int32_t>(), wts_.as<float>(), s);
    moe(li, T);
}

void Batch::moe(int li, int T) {
    cudaStream_t s = stream();
    const Config& c = c_;
    const Layer& L = m_.layers[size_t(li)];
    const int k = c.n_expert_used;
    float* h = h_.as<float>();
    const float* xn = xn_.as<float>();
    if (T == 1 && !m_.batch_invariant && ehcuda::moe_decode_supported(L.gate_exps, L.up_exps, L.down_exps, k)) {
        // the pre-norm inside the kernels (the caller skipped it), and the
        // routing where moe_fused_route says (else the caller routed)
        ehcuda::MoeDecodeArgs md = moe_decode_args(c, L, h, router_.as<float>(), ids_.as<int32_t>(), wts_.as<float>(),
                                                   ff_.get(), ff_.size());
        if (!moe_fused_route(m_)) {
            md.logits = nullptr;
            md.ids = ids_.as<int32_t>();
            md.weights = wts_.as<float>();
        }
        ehcuda::moe_decode(md, s);
        return;
    }
    const bool grouped_ok = (T >= 2 || m_.batch_invariant) && grouped_.get() && ehcuda::moe_grouped_supported(L.gate_exps, L.up_exps, L.down_exps, k);
    if (grouped_ok) {
        // Every token of the call routed to an expert is multiplied with
        // that expert together, whichever sequence it belongs to.
        for (int t0 = 0; t0 < T; t0 += moe_grouped_max_) grouped(li, t0, std::min(moe_grouped_max_, T - t0));
        return;
    }
    for (int t0 = 0; t0 < T; t0 += kMoeChunk) {
        const int n = std::min(kMoeChunk, T - t0);
        const float* x = xn + size_t(t0) * c.n_embd;
        const int32_t* ids = ids_.as<int32_t>() + size_t(t0) * k;
        const float* w = wts_.as<float>() + size_t(t0) * k;
        float* hc = h + size_t(t0) * c.n_embd;
        if (moe_ws_ && ehcuda::moe_prefill(moe_ws_.get(), x, c.n_embd, n, k, c.n_expert, ids, w, L.gate_exps, L.up_exps,
                                           L.down_exps, c.swiglu_alpha, c.swiglu_limit, hc, c.n_embd, s))
            continue;
        ehcuda::moe_gate_up(x, c.n_embd, n, k, ids, L.gate_exps, L.up_exps, c.swiglu_alpha, c.swiglu_limit,
                            ff_.as<float>(), s);
        ehcuda::moe_down(ff_.as<float>(), n, k, ids, w, L.down_exps, hc, c.n_embd, s);
    }
}

void Batch::grouped(int li, int t0, int n) {
    const Config& c = c_;
    const int k = c.n_expert_used;
    ehcuda::MoeGroupedArgs a = moe_grouped_args(c, m_.layers[size_t(li)], xn_.as<float>() + size_t(t0) * c.n_embd, n,
                                                 ids_.as<int32_t>() + size_t(t0) * k, wts_.as<float>() + size_t(t0) * k,
                                                 h_.as<float>() + size_t(t0) * c.n_embd, grouped_.get(), grouped_.size());
    a.one_form = m_.batch_invariant;
    ehcuda::moe_grouped(a, stream());
}

void Batch::forward(const ehcuda::StepView& v) {
    cudaStream_t s = stream();
    const Config& c = c_;
    const int T = v.ntok;
    float* h = h_.as<float>();
    ehcuda::embed_rows(m_.tok_embd, v.d_tokens, T, h, s);
    if (c.arch == Arch::Gpt2) ehcuda::add_position_rows_at(m_.pos_embd, v.d_pos, T, h, s);
    for (int li = 0; li < c.n_layer; ++li) {
        if (c.arch == Arch::Gpt2) gpt2_layer(li, v);
        else moe_layer(li, v);
    }
    if (v.nout == 0) return;
    // LM head on the tokens that need logits only (every token's, in order,
    // when each has a row: decode and verify steps read h itself).
    const float* last = h;
    if (v.nout != v.ntok) {
        ehcuda::gather_rows(h, c.n_embd, v.d_out_idx, v.nout, c.n_embd, last_.as<float>(), s);
        last = last_.as<float>();
    }
    ehcuda::MatSeg head;
    head.w = m_.output;
    float* xn = xn_.as<float>();
    if (c.arch == Arch::Gpt2) {
        ehcuda::layernorm(last, c.n_embd, m_.output_norm, m_.output_norm_b, xn, c.n_embd, c.n_embd, v.nout, c.eps, s);
        matmul(&head, 1, c.n_embd, xn, c.n_embd, ehcuda::XMode::Plain, v.logits, c.n_vocab, false, v.nout);
    } else {
        normed_matmul(&head, 1, last, m_.output_norm, v.logits, c.n_vocab, v.nout, v.nout == 1 && !v.lora);
    }
    adapt(v, {lora_head_site(c)}, xn, c.n_embd, v.logits, c.n_vocab, v.nout, v.nout != v.ntok ? v.d_out_idx : nullptr);
}

void Batch::adapt(const ehcuda::StepView& v, std::initializer_list<int> sites, const float* x, int ldx, float* y,
                  int ldy, int n, const int32_t* row_token) {
    if (v.lora)
        lora_.apply(m_.lora, sites, v.d_lora, row_token, n, x, ldx, y, ldy, ledger(), stream(), v.spans, v.nspans,
                    workspace());
}

}  // namespace gpt_cuda
