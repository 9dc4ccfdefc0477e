#include "batch.hpp"
#include "lora.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <ehcuda/check.hpp>
#include <ehcuda/device_set.hpp>
#include <ehcuda/gpt_ops.hpp>
#include <ehcuda/kernel_route.hpp>
#include <ehcuda/kv_accept.hpp>
#include <ehcuda/kv_quant.hpp>
#include <ehcuda/kv_quant_store.hpp>
#include <ehcuda/moe.hpp>
#include <ehcuda/moe_expert_range.hpp>
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
    ehcuda::BatchShape sh = ehcuda::rank_pool_shape(m);
    // gpt2 has a table of learned positions: no room past its end
    if (c.arch == Arch::Gpt2) sh.seq_cap = uint32_t(c.n_ctx_train);
    sh.max_cols = std::max({c.n_embd, c.q_dim(), c.arch == Arch::Gpt2 ? c.n_ff : 0});
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
    last_ = ehcuda::DeviceBuffer(T * c_.n_embd * 4, L);
    // The LM head's lane (and every rank's at tp 1): the step's stream,
    // workspace and rows.
    head_.step_lane(m_.device, stream(), &m_.cfg, h_.as<float>(), xn_.as<float>(), workspace());
    if (m_.rank_streams)
        group_ = ehcuda::make_rank_group("gpt-cuda", ehcuda::shard_devices(m_.shards), m_.device, T * c_.n_embd,
                                         m_.plan.allreduce_signals, m_.plan.allreduce_nccl_min_floats, L, &signals_);
    ranks_.resize(size_t(m_.tp));
    for (int i = 0; i < m_.tp; ++i) {
        Rank& r = ranks_[size_t(i)];
        const Shard* sh = r.place(m_, i, group_.get(), stream(), h_.as<float>(), xn_.as<float>(), T * c_.n_embd * 4,
                                  workspace(), L);
        r.inv_freq = sh ? sh->inv_freq : m_.inv_freq;
        r.expert0 = sh ? sh->expert0 : 0;
        r.n_local = sh ? sh->n_local : c_.n_expert;
        const Config& rc = *r.c;
        if (sh)
            r.own_shard(sh->mirror, max_step_tokens(), std::max(c_.n_embd, rc.q_dim()), gemv_per_token_max_ + 1, !group_,
                        T * c_.n_embd * 4, L);
        r.qkv = ehcuda::DeviceBuffer(T * rc.qkv_dim() * 4, L);
        r.attn = ehcuda::DeviceBuffer(T * rc.q_dim() * 4, L);
        if (c_.arch == Arch::Gpt2) {
            r.ff = ehcuda::DeviceBuffer(T * c_.n_ff * 4, L);
        } else {
            // (the rank's expert width: the model's, or its share within experts)
            const size_t K = size_t(c_.n_expert_used), chunk = std::min<size_t>(T, kMoeChunk);
            r.ff = ehcuda::DeviceBuffer(
                std::max(chunk * K * rc.n_ff_exp * 4, ehcuda::moe_decode_scratch_bytes(int(K), rc.n_ff_exp)), L);
            r.router = ehcuda::DeviceBuffer(T * c_.n_expert * 4, L);
            // moe_router_decode's counter, then moe_decode_mma's
            r.router_counter = ehcuda::DeviceBuffer(4 * size_t(1 + ehcuda::moe_decode_mma_counters(c_.n_embd)), L);
            EHC_CHECK(cudaMemset(r.router_counter.get(), 0, r.router_counter.size()));
            if (moe_grouped_max_ >= 2)
                r.grouped = ehcuda::DeviceBuffer(
                    ehcuda::moe_grouped_scratch_bytes(int(std::min<size_t>(T, size_t(moe_grouped_max_))), int(K), c_.n_expert,
                                                      c_.n_embd, rc.n_ff_exp),
                    L);
            r.ids = ehcuda::DeviceBuffer(T * K * 4, L);
            r.wts = ehcuda::DeviceBuffer(T * K * 4, L);
            // The cuBLAS form's workspace only where some layer's experts need it.
            bool all_grouped = moe_grouped_max_ >= 2;
            for (const Layer& ly : *r.layers)
                all_grouped = all_grouped && ehcuda::moe_grouped_supported(ly.gate_exps, ly.up_exps, ly.down_exps, int(K));
            if (!all_grouped) {
                ehcuda::PrefillShape ps;
                ps.max_tokens = int(chunk);
                ps.max_cols = c_.n_embd;
                ps.moe_experts = c_.n_expert;
                ps.moe_k = c_.n_expert_used;
                ps.moe_embd = c_.n_embd;
                ps.moe_ff = rc.n_ff_exp;
                r.moe_ws = std::make_unique<ehcuda::PrefillWorkspace>(ps, r.stream, L);
            }
        }
        if (c_.arch != Arch::Gpt2 && ehcuda::attention_head_dim_fast(c_.head_dim))
            r.decode_scratch(max_step_entries(), max_seq_tokens(), L);
    }
    rows_.bind(group_.get(), ranks_);
    EHC_CHECK(cudaSetDevice(m_.device));
    workspace()->set_min_tokens(gemv_per_token_max_ + 1);
    workspace()->set_mirror(&m_.mirror);
    init_pool();
}

Batch::~Batch() {
    for (Rank& r : ranks_) {
        cudaSetDevice(r.device);
        if (r.stream) cudaStreamSynchronize(r.stream);
        r.own_pw.reset();
        r.moe_ws.reset();
    }
    cudaSetDevice(m_.device);
    cudaStreamSynchronize(stream());
}

void Batch::accept_kv_type(const Model& m, uint32_t type) {
    ehcuda::accept_quantized_kv("gpt-cuda", type, m.cfg.n_kv, m.cfg.head_dim);
}

void Batch::matmul(Rank& r, const ehcuda::MatSeg* segs, int nseg, int cols, const float* x, int ldx, ehcuda::XMode mode,
                   float* y, int ldy, bool accumulate, int n, const float* norm_w) {
    r.run_matmul(r.matmul_args(segs, nseg, cols, x, ldx, mode, y, ldy, accumulate, n, norm_w, c_.eps),
                 gemv_per_token_max_, stream(), [this](int k, auto&& fn) { per_token(k, fn); });
}

void Batch::normed_matmul(Rank& r, const ehcuda::MatSeg* segs, int nseg, const float* x, const float* norm_w, float* y,
                          int ldy, int n, bool fold) {
    const int E = c_.n_embd;
    if (fold) {
        matmul(r, segs, nseg, E, x, E, ehcuda::XMode::RmsNorm, y, ldy, false, 1, norm_w);
        return;
    }
    ehcuda::rmsnorm(x, E, norm_w, r.xn, E, E, n, c_.eps, r.stream);
    matmul(r, segs, nseg, E, r.xn, E, ehcuda::XMode::Plain, y, ldy, false, n);
}

bool Batch::attend(Rank& rk, int li, const ehcuda::StepView& v, int n_rot, int window, const float* sinks,
                   const ehcuda::MatSeg& attn_out, const float* q_norm, const float* k_norm) {
    cudaStream_t s = rk.stream;
    const Config& c = *rk.c;
    const int pl = pool_layer(rk, li);
    float* qkv = rk.qkv.as<float>();
    const float scale = 1.0f / std::sqrt(float(c.head_dim));
    if (v.decode && n_rot > 0 && rk.attn_scratch.size() &&
        ehcuda::attention_decode_fused_takes(v.ntok, c.n_head, c.n_kv, c.head_dim)) {
        // Decode rows: RoPE, the K/V store, split-K attention (with the
        // sinks, gpt-oss) in one launch (the session's decode attention, paged).
        const bool chunks = v.ntok == 1 && !v.lora && rk.attn_chunks.size() && ehcuda::gemv_takes_chunks(attn_out.w.type);
        ehcuda::DecodeAttnArgs da = rk.decode_attn_args(v, k_pool(pl), v_pool(pl), kv_type(), max_seq_tokens(), chunks);
        da.n_rot = n_rot;
        da.neox = true;
        da.inv_freq = rk.inv_freq;
        da.attn_factor = c.attn_factor;
        da.sinks = sinks;
        da.q_norm = q_norm;
        da.k_norm = k_norm;
        da.norm_eps = c.eps;
        da.window = window;
        da.scale = scale;
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
    r.inv_freq = rk.inv_freq;
    r.attn_factor = c.attn_factor;
    r.ntok = v.ntok;
    r.k_cache = k_pool(pl);
    r.v_cache = v_pool(pl);
    r.d_pos = v.d_pos;
    r.d_rows = v.d_rows;
    if (kv_type() != EH_TYPE_F16) ehcuda::rope_table_store_kv_quant(r, kv_type(), s);
    else ehcuda::rope_table_store_kv(r, s);

    // (every step's rows take the query-group kernel where it takes the
    // heads, a key read once per KV head; with the sinks and window)
    ehcuda::StepAttnArgs at = rk.step_attn_args(k_pool(pl), v_pool(pl), kv_type());
    at.window = window;
    at.sinks = sinks;
    at.scale = scale;
    ehcuda::step_attention(at, v, s);
    return false;
}

void Batch::gpt2_layer(int li, const ehcuda::StepView& v) {
    Rank& r = ranks_[0];
    cudaStream_t s = r.stream;
    const Config& c = c_;
    const Layer& L = m_.layers[size_t(li)];
    const int T = v.ntok;
    float* h = r.h;
    float* xn = r.xn;
    float* ff = r.ff.as<float>();
    float* qkv = r.qkv.as<float>();
    float* attn = r.attn.as<float>();

    ehcuda::layernorm(h, c.n_embd, L.attn_norm, L.attn_norm_b, xn, c.n_embd, c.n_embd, T, c.eps, s);
    matmul(r, L.qkv, L.n_qkv, c.n_embd, xn, c.n_embd, ehcuda::XMode::Plain, qkv, c.qkv_dim(), false, T);
    adapt(v, {lora_site(li, kLoraQ), lora_site(li, kLoraK), lora_site(li, kLoraV)}, xn, c.n_embd, qkv, c.qkv_dim(), T);
    attend(r, li, v, 0, 0, nullptr, L.attn_out);  // (no rotation: stores K and V)
    matmul(r, &L.attn_out, 1, c.q_dim(), attn, c.q_dim(), ehcuda::XMode::Plain, h, c.n_embd, true, T);
    adapt(v, {lora_site(li, kLoraOut)}, attn, c.q_dim(), h, c.n_embd, T);

    ehcuda::layernorm(h, c.n_embd, L.ffn_norm, L.ffn_norm_b, xn, c.n_embd, c.n_embd, T, c.eps, s);
    matmul(r, &L.ffn_up, 1, c.n_embd, xn, c.n_embd, ehcuda::XMode::Plain, ff, c.n_ff, false, T);
    adapt(v, {lora_site(li, kLoraUp)}, xn, c.n_embd, ff, c.n_ff, T);
    ehcuda::gelu_tanh_inplace(ff, c.n_ff, c.n_ff, T, s);
    matmul(r, &L.ffn_down, 1, c.n_ff, ff, c.n_ff, ehcuda::XMode::Plain, h, c.n_embd, true, T);
    adapt(v, {lora_site(li, kLoraDown)}, ff, c.n_ff, h, c.n_embd, T);
}

void Batch::attention_block(Rank& r, int li, const ehcuda::StepView& v, float* y, bool acc) {
    const Config& c = c_;
    const Config& rc = *r.c;
    const Layer& L = (*r.layers)[size_t(li)];
    const int T = v.ntok;
    float* qkv = r.qkv.as<float>();
    // One token: the pre-norm folds into the GEMV's input staging, as in a
    // session's decode step.
    normed_matmul(r, L.qkv, L.n_qkv, r.h, L.attn_norm, qkv, rc.qkv_dim(), T, T == 1 && !v.lora);
    adapt(v, {lora_site(li, kLoraQ), lora_site(li, kLoraK), lora_site(li, kLoraV)}, r.xn, c.n_embd, qkv, rc.qkv_dim(), T);
    const float* q_norm = c.qk_norm ? L.q_norm : nullptr;
    const float* k_norm = c.qk_norm ? L.k_norm : nullptr;
    if (attend(r, li, v, c.n_rot, L.window, L.sinks, L.attn_out, q_norm, k_norm))
        matmul(r, &L.attn_out, 1, rc.q_dim(), r.attn_chunks.as<float>(), rc.q_dim(), ehcuda::XMode::Chunks, y, c.n_embd,
               acc, 1);
    else
        matmul(r, &L.attn_out, 1, rc.q_dim(), r.attn.as<float>(), rc.q_dim(), ehcuda::XMode::Plain, y, c.n_embd, acc, T);
    adapt(v, {lora_site(li, kLoraOut)}, r.attn.as<float>(), rc.q_dim(), y, c.n_embd, T);
}

void Batch::expert_block(Rank& r, int li, const ehcuda::StepView& v, float* y) {
    cudaStream_t s = r.stream;
    const Config& c = c_;
    const Layer& L = (*r.layers)[size_t(li)];
    const int T = v.ntok;
    const bool sharded = m_.tp > 1;
    // (a rank's partial starts from zero: the expert kernels add into it)
    if (sharded) EHC_CHECK(cudaMemsetAsync(y, 0, size_t(T) * c.n_embd * 4, s));
    // One token: the pre-norm folds into the expert kernel's input staging
    // (and the router's), as in a session's decode step.
    const bool one = T == 1 && !m_.batch_invariant &&
                     ehcuda::moe_decode_supported(L.gate_exps, L.up_exps, L.down_exps, c.n_expert_used);
    if (m_.batch_invariant && router_rows(m_, L)) {
        invariant_moe(r, li, T);
        return;
    }
    int32_t* ids = r.ids.as<int32_t>();
    float* wts = r.wts.as<float>();
    // (one token: the expert kernel reads h, and routes for itself where
    // fused_route() says; the router's own kernel where router_decode
    // says, routing too where the expert kernel does not)
    if (one && router_decode(m_, L)) {
        ehcuda::moe_router_decode(
            router_decode_args(c, L, r.h, r.router.as<float>(), fused_route() ? nullptr : ids, wts, r.router_counter.as<int>()),
            s);
    } else {
        normed_matmul(r, &L.router, 1, r.h, L.ffn_norm, r.router.as<float>(), c.n_expert, T, one);
        if (!one || !fused_route()) ehcuda::moe_route(r.router.as<float>(), T, c.n_expert, c.n_expert_used, ids, wts, s);
    }
    // A rank of whole experts keeps the pairs routed to them (as local
    // indices) and marks the others -1, which the expert kernels skip;
    // within experts every rank runs every pair on its rows.
    if (sharded && !m_.expert_rows) ehcuda::moe_keep_expert_range(ids, wts, T, c.n_expert_used, r.expert0, r.n_local, s);
    moe(r, li, T, y);
}

// batch_invariant's expert block (see the top of the file; tp 1): the
// router and pre-norm through moe_router_rows for every T; one token's
// experts through moe_decode_mma (its input, FP16, and its scratch in the
// grouped kernels' scratch, unused by a one-token step), more tokens'
// grouped.
void Batch::invariant_moe(Rank& r, int li, int T) {
    cudaStream_t s = r.stream;
    const Config& c = c_;
    const Layer& L = (*r.layers)[size_t(li)];
    const int k = c.n_expert_used;
    const bool one = T == 1 && ehcuda::moe_decode_mma_supported(L.gate_exps, L.up_exps, L.down_exps, k, c.n_expert);
    char* g = static_cast<char*>(r.grouped.get());
    const size_t x16_bytes = (size_t(c.n_embd) * 2 + 255) / 256 * 256;
    ehcuda::MoeRouterRowsArgs ra;
    set_router_args(ra, c, L, r.h, r.router.as<float>());
    ra.ldx = c.n_embd;
    ra.ntok = T;
    if (one) ra.xn16 = g;
    else ra.xn = r.xn;
    ehcuda::moe_router_rows(ra, s);
    if (one) {
        ehcuda::MoeDecodeMmaArgs md;
        set_expert_args(md, c, L, g + x16_bytes, r.grouped.size() - x16_bytes, r.h);
        md.x16 = g;
        md.logits = r.router.as<float>();
        md.ids = r.ids.as<int32_t>();
        md.weights = r.wts.as<float>();
        md.counters = r.router_counter.as<int>() + 1;
        ehcuda::moe_decode_mma(md, s);
        return;
    }
    ehcuda::moe_route(r.router.as<float>(), T, c.n_expert, k, r.ids.as<int32_t>(), r.wts.as<float>(), s);
    moe(r, li, T, r.h);
}

void Batch::moe(Rank& r, int li, int T, float* y) {
    cudaStream_t s = r.stream;
    const Config& c = c_;
    const Layer& L = (*r.layers)[size_t(li)];
    const int k = c.n_expert_used;
    const float* xn = r.xn;
    if (T == 1 && !m_.batch_invariant && ehcuda::moe_decode_supported(L.gate_exps, L.up_exps, L.down_exps, k)) {
        // the pre-norm inside the kernels (the caller skipped it), and the
        // routing where fused_route() says (else the caller routed)
        ehcuda::MoeDecodeArgs md = moe_decode_args(c, L, r.h, r.router.as<float>(), r.ids.as<int32_t>(), r.wts.as<float>(),
                                                   r.ff.get(), r.ff.size());
        if (!fused_route()) {
            md.logits = nullptr;
            md.ids = r.ids.as<int32_t>();
            md.weights = r.wts.as<float>();
        }
        md.h = y;
        ehcuda::moe_decode(md, s);
        return;
    }
    const bool grouped_ok = (T >= 2 || m_.batch_invariant) && r.grouped.get() &&
                            ehcuda::moe_grouped_supported(L.gate_exps, L.up_exps, L.down_exps, k);
    if (grouped_ok) {
        // Every token of the call routed to an expert is multiplied with
        // that expert together, whichever sequence it belongs to.
        for (int t0 = 0; t0 < T; t0 += moe_grouped_max_) grouped(r, li, t0, std::min(moe_grouped_max_, T - t0), y);
        return;
    }
    for (int t0 = 0; t0 < T; t0 += kMoeChunk) {
        const int n = std::min(kMoeChunk, T - t0);
        const float* x = xn + size_t(t0) * c.n_embd;
        const int32_t* ids = r.ids.as<int32_t>() + size_t(t0) * k;
        const float* w = r.wts.as<float>() + size_t(t0) * k;
        float* hc = y + size_t(t0) * c.n_embd;
        if (r.moe_ws && ehcuda::moe_prefill(r.moe_ws.get(), x, c.n_embd, n, k, r.n_local, ids, w, L.gate_exps, L.up_exps,
                                            L.down_exps, c.swiglu_alpha, c.swiglu_limit, hc, c.n_embd, s))
            continue;
        ehcuda::moe_gate_up(x, c.n_embd, n, k, ids, L.gate_exps, L.up_exps, c.swiglu_alpha, c.swiglu_limit,
                            r.ff.as<float>(), s);
        ehcuda::moe_down(r.ff.as<float>(), n, k, ids, w, L.down_exps, hc, c.n_embd, s);
    }
}

void Batch::grouped(Rank& r, int li, int t0, int n, float* y) {
    const Config& c = c_;
    const int k = c.n_expert_used;
    ehcuda::MoeGroupedArgs a = moe_grouped_args(c, (*r.layers)[size_t(li)], r.xn + size_t(t0) * c.n_embd, n,
                                                 r.ids.as<int32_t>() + size_t(t0) * k, r.wts.as<float>() + size_t(t0) * k,
                                                 y + size_t(t0) * c.n_embd, r.grouped.get(), r.grouped.size());
    a.n_expert = r.n_local;  // (a rank's ids are its local experts')
    a.one_form = m_.batch_invariant;
    ehcuda::moe_grouped(a, r.stream);
}

void Batch::forward(const ehcuda::StepView& v) {
    cudaStream_t s = stream();
    const Config& c = c_;
    const int T = v.ntok;
    float* h = h_.as<float>();
    // A row-parallel piece (attn_output, the experts) adds into h at tp 1;
    // with ranks each writes its share, and one all-reduce adds their sum
    // into the residual (tp_step.hpp).
    const size_t rows = size_t(T) * c.n_embd;
    auto all_reduce = [&] { rows_.all_reduce(s, rows, size_t(m_.plan.allreduce_nccl_min_floats), signals_); };
    // Rank r's GPU current for its launches (its own stream's GPU).
    auto use = [&](const Rank& r) {
        if (group_) group_->use(r.index);
    };
    ehcuda::embed_rows(m_.tok_embd, v.d_tokens, T, h, s);
    if (c.arch == Arch::Gpt2) ehcuda::add_position_rows_at(m_.pos_embd, v.d_pos, T, h, s);
    // Ranks on their own streams start from the embedded rows: rank 0 in
    // place, the others with a copy of their own.
    rows_.fork(s, rows);
    for (int li = 0; li < c.n_layer; ++li) {
        if (c.arch == Arch::Gpt2) {
            gpt2_layer(li, v);
            continue;
        }
        for (Rank& r : ranks_) {
            use(r);
            attention_block(r, li, v, rows_.target(r.index), m_.tp == 1);
        }
        all_reduce();
        for (Rank& r : ranks_) {
            use(r);
            expert_block(r, li, v, rows_.target(r.index));
        }
        all_reduce();
    }
    // Rank 0's rows (h) hold the whole residual; the LM head and the
    // sampler run on the step's stream, on rank 0's GPU.
    if (group_) group_->join(s);
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
        matmul(head_, &head, 1, c.n_embd, xn, c.n_embd, ehcuda::XMode::Plain, v.logits, c.n_vocab, false, v.nout);
    } else {
        normed_matmul(head_, &head, 1, last, m_.output_norm, v.logits, c.n_vocab, v.nout, v.nout == 1 && !v.lora);
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
