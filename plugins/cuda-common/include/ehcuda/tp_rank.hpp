// One rank's lane of a batched step, for every CUDA plugin that shards
// (gpt-cuda, llama-cuda; cuda-common README, "Tensor parallelism"): where
// its work goes (GPU, stream, cuBLAS workspace), its residual and normed
// rows, the activations every engine's rank has, and the setup those take
// in a Batch's constructor. An engine's Rank derives from it and adds its
// own buffers (gpt-cuda's experts). At tp 1 the one rank is the whole
// model on the step's stream, rows and workspace.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <vector>

#include <ehcuda/batch.hpp>
#include <ehcuda/check.hpp>
#include <ehcuda/device_memory.hpp>
#include <ehcuda/kernels.hpp>
#include <ehcuda/prefill_workspace.hpp>
#include <ehcuda/step_attention.hpp>
#include <ehcuda/tp_group.hpp>
#include <ehcuda/weight_mirror.hpp>

namespace ehcuda {

// Config and Layer: the engine's (the rank's own n_head, n_kv; its layers'
// matrices, its shard's slices when sharded).
template <class Config, class Layer>
struct RankLane {
    int index = 0;
    int device = 0;
    cudaStream_t stream = nullptr;  // the step's stream, or its own (rank_streams)
    const Config* c = nullptr;
    const std::vector<Layer>* layers = nullptr;
    float* h = nullptr;   // its residual rows: the step's h_, or its own copy (rank_streams, rank > 0)
    float* xn = nullptr;  // its normed rows
    DeviceBuffer own_h, own_xn;
    PrefillWorkspace* pw = nullptr;  // the step's, or its own (tp > 1: its shard's mirror)
    std::unique_ptr<PrefillWorkspace> own_pw;
    DeviceBuffer qkv, attn, ff;
    DeviceBuffer part;  // shard mode: its share of a row-parallel matmul, before the all-reduce
    // decode rows: the paged fused decode attention's split scratch,
    // counters and (one row) quantized output
    DeviceBuffer attn_scratch, attn_counters, attn_chunks;

    // The LM head's lane (and every rank's at tp 1): the step's GPU,
    // stream, rows and workspace, the model's config.
    void step_lane(int dev, cudaStream_t step, const Config* cfg, float* step_h, float* step_xn,
                   PrefillWorkspace* step_pw) {
        device = dev;
        stream = step;
        c = cfg;
        h = step_h;
        xn = step_xn;
        pw = step_pw;
    }

    // Rank i of model m (its cfg, layers, device, tp, shards): shard i's
    // config, layers and GPU (made current), or at tp 1 the model's; the
    // group's stream i (rank_streams) or the step's; the step's rows h /
    // xn, or (a group's rank > 0; rank 0 keeps the step's rows, which the
    // LM head reads after the join) rows of its own of row_bytes each. Its
    // workspace the step's, step_pw. Returns its shard (null at tp 1).
    template <class Model>
    auto place(const Model& m, int i, const TpGroup* group, cudaStream_t step, float* step_h, float* step_xn,
               size_t row_bytes, PrefillWorkspace* step_pw, MemoryLedger* L) {
        const auto* sh = m.tp == 1 ? nullptr : &m.shards[size_t(i)];
        c = sh ? &sh->c : &m.cfg;
        layers = sh ? &sh->layers : &m.layers;
        index = i;
        device = sh ? sh->device : m.device;
        stream = group ? group->stream(i) : step;
        EHC_CHECK(cudaSetDevice(device));
        h = step_h;
        xn = step_xn;
        if (group && i > 0) {
            own_h = DeviceBuffer(row_bytes, L);
            own_xn = DeviceBuffer(row_bytes, L);
            h = own_h.as<float>();
            xn = own_xn.as<float>();
        }
        pw = step_pw;
        return sh;
    }

    // A shard's rank (tp > 1): a workspace of its own on its stream and GPU
    // for max_tokens x max_cols, cuBLAS from min_tokens on over the shard's
    // FP16 mirror; and in the shard mode (no group) its share's rows of
    // part_bytes.
    void own_shard(const WeightMirror& mirror, int max_tokens, int max_cols, int min_tokens, bool shard_mode,
                   size_t part_bytes, MemoryLedger* L) {
        PrefillShape ps;
        ps.max_tokens = max_tokens;
        ps.max_cols = max_cols;
        own_pw = std::make_unique<PrefillWorkspace>(ps, stream, L);
        own_pw->set_min_tokens(min_tokens);
        own_pw->set_mirror(&mirror);
        pw = own_pw.get();
        if (shard_mode) part = DeviceBuffer(part_bytes, L);
    }

    // The fused paged decode attention's buffers for steps of up to
    // max_entries rows of the rank's heads (sequences of up to seq_cap
    // tokens): split scratch for the widest such step, its zeroed counters,
    // and (one row) its output quantized for attn_output.
    void decode_scratch(int max_entries, uint32_t seq_cap, MemoryLedger* L) {
        const Config& rc = *c;
        size_t heads_x_splits = 0;
        for (int n = 1; n <= max_entries; ++n)
            heads_x_splits = std::max(heads_x_splits,
                                      size_t(n) * rc.n_head * attention_decode_row_splits(seq_cap, rc.n_head, n));
        attn_scratch = DeviceBuffer(heads_x_splits * (rc.head_dim + 2) * 4, L);
        attn_counters = DeviceBuffer(attention_decode_counters(rc.n_head, max_entries) * 4, L);
        EHC_CHECK(cudaMemset(attn_counters.get(), 0, attn_counters.size()));
        if (const size_t n = gemv_chunk_bytes(rc.q_dim())) attn_chunks = DeviceBuffer(n, L);
    }

    // The fused paged decode attention (rope_attention_decode) of a decode
    // step's v.ntok rows of the rank's heads, from its qkv rows into its
    // attn rows (and with `chunks`, one row, its attn_chunks), over the
    // pools of its layer (k_pool, v_pool of kv_type), split as
    // decode_scratch sized it for sequences of up to seq_cap tokens. The
    // engine adds the rotation, window, scale, norms and sinks.
    DecodeAttnArgs decode_attn_args(const StepView& v, __half* k_pool, __half* v_pool, uint32_t kv_type,
                                    uint32_t seq_cap, bool chunks) const {
        const Config& rc = *c;
        DecodeAttnArgs da;
        da.qkv = qkv.as<float>();
        da.n_head = rc.n_head;
        da.n_kv = rc.n_kv;
        da.head_dim = rc.head_dim;
        da.k_cache = k_pool;
        da.v_cache = v_pool;
        da.kv_type = kv_type;
        da.out = attn.as<float>();
        da.nsplit = attention_decode_row_splits(seq_cap, rc.n_head, v.ntok);
        da.scratch = attn_scratch.as<float>();
        da.counters = attn_counters.as<uint32_t>();
        if (chunks) da.out_chunks = attn_chunks.get();
        da.paged = true;
        da.nrows = v.ntok;
        da.ldqkv = rc.qkv_dim();
        da.ldo = rc.q_dim();
        da.d_pos = v.d_pos;
        da.d_rows = v.d_rows;
        da.d_table = v.d_table;
        da.tables = v.d_tables;
        return da;
    }

    // The step attention (step_attention.hpp) of the rank's heads, from its
    // qkv rows into its attn rows, over the pools of its layer (k_pool,
    // v_pool of kv_type), its decode scratch the query-group kernel's. The
    // engine adds window, scale, sinks and the rest.
    StepAttnArgs step_attn_args(const __half* k_pool, const __half* v_pool, uint32_t kv_type) const {
        const Config& rc = *c;
        StepAttnArgs at;
        at.q = qkv.as<float>();
        at.ldq = rc.qkv_dim();
        at.out = attn.as<float>();
        at.ldo = rc.q_dim();
        at.k_pool = k_pool;
        at.v_pool = v_pool;
        at.kv_type = kv_type;
        at.n_head = rc.n_head;
        at.n_kv = rc.n_kv;
        at.head_dim = rc.head_dim;
        at.group_scratch = attn_scratch.as<float>();
        at.group_scratch_floats = attn_scratch.size() / 4;
        at.pw = pw;
        return at;
    }

    // y (+)= segs . x over n tokens (x normed by norm_w inside with
    // XMode::RmsNorm), the rank's workspace the GEMM's.
    MatmulArgs matmul_args(const MatSeg* segs, int nseg, int cols, const float* x, int ldx, XMode mode, float* y,
                           int ldy, bool accumulate, int n, const float* norm_w, float norm_eps) const {
        MatmulArgs m;
        m.norm_w = norm_w;
        m.norm_eps = norm_eps;
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
        return m;
    }

    // m on the rank's stream: one call, or (2 .. per_token_max tokens the
    // bulk GEMV's token groups do not take) one single-token call per
    // token, overlapping on the step's side streams (per_token(n, fn):
    // BatchBase::per_token) when the rank runs on the step's stream `step`,
    // one after another on its own stream otherwise (side streams fork
    // from the step's stream).
    template <class PerToken>
    void run_matmul(const MatmulArgs& m, int per_token_max, cudaStream_t step, PerToken&& per_token) const {
        if (m.ntok > 1 && m.ntok <= per_token_max && !matmul_groups_tokens(m)) {
            auto one_token = [&](int t, cudaStream_t st) {
                MatmulArgs one = m;
                one.ntok = 1;
                one.x = m.x + size_t(t) * m.ldx;
                one.y = m.y + size_t(t) * m.ldy;
                matmul(one, st);
            };
            if (stream == step) per_token(m.ntok, one_token);
            else
                for (int t = 0; t < m.ntok; ++t) one_token(t, stream);
        } else {
            matmul(m, stream);
        }
    }
};

// The KV pool of a model (device, ledger, cfg, tp, shards, plan) whose
// ranks keep their own KV heads: a pool layer per rank and layer, each of
// kv_dim / tp (rank r's of layer l at l * tp + r, on its shard's GPU; the
// block tables shared). The engine adds the rest (max_cols, seq_cap,
// hidden_dim).
template <class Model>
BatchShape rank_pool_shape(Model& m) {
    BatchShape sh;
    sh.device = m.device;
    sh.ledger = &m.ledger;
    sh.n_vocab = m.cfg.n_vocab;
    sh.n_layer = m.cfg.n_layer * m.tp;
    sh.kv_dim = m.cfg.kv_dim() / m.tp;
    if (m.tp > 1)
        for (int l = 0; l < sh.n_layer; ++l) sh.layer_devices.push_back(m.shards[size_t(l % m.tp)].device);
    sh.upload_aside = m.plan.step_upload_aside;
    return sh;
}

// Each shard's GPU, in rank order (make_rank_group's devices).
template <class Shard>
std::vector<int> shard_devices(const std::vector<Shard>& shards) {
    std::vector<int> devices;
    for (const Shard& s : shards) devices.push_back(s.device);
    return devices;
}

}  // namespace ehcuda
