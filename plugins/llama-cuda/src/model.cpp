#include "model.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <engine_host/model_source.hpp>
#include <engine_host/rope_scaling.hpp>
#include <ehcuda/allreduce.hpp>
#include <ehcuda/check.hpp>
#include <ehcuda/device_set.hpp>
#include <ehcuda/model_matrices.hpp>
#include <ehcuda/options.hpp>
#include <ehcuda/prefill_slab.hpp>
#include <ehcuda/shard_load.hpp>
#include <ehcuda/tp_group.hpp>
#include <ehcuda/tp_split.hpp>
#include <ehcuda/upload.hpp>
#include <ehcuda/upload_devices.hpp>
#include <ehcuda/weight_plan.hpp>

namespace llama_cuda {
namespace {

// Headroom checked on top of the weights at load: the batched step's
// activations and a KV pool of a modest context.
constexpr size_t kLoadHeadroom = size_t(64) << 20;

[[noreturn]] void fail(const std::string& msg) { throw ehp::Error(EH_MODEL_LOAD_FAILED, msg); }

float half_to_float(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {  // subnormal
            int e = -1;
            do { ++e; man <<= 1; } while (!(man & 0x400));
            bits = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3FF) << 13;
        }
    } else if (exp == 31) {
        bits = sign | 0x7F800000u | man << 13;
    } else {
        bits = sign | (exp + 127 - 15) << 23 | man << 13;
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// Plans the arena and the upload list while checking each tensor.
class Loader : public ehcuda::ShardedLoader {
public:
    Loader(Model& m, const ehp::ModelView& view) : ShardedLoader(m.arena, view) {}

    // Rows r0 .. r0 + n - 1 of a rows x cols matrix (a column-parallel
    // rank's share), as a matrix of its own.
    void row_slice(const eh_tensor& t, int64_t cols, int64_t rows, int64_t r0, int64_t n, const std::string& tag,
                   ehcuda::WeightRef& out) {
        const size_t rb = check(t, cols, rows);
        const std::string name = std::string(ehp::to_sv(t.name)) + tag;
        const size_t off = at->add(static_cast<const uint8_t*>(t.data) + size_t(r0) * rb, size_t(n) * rb,
                                   size_t(n) * rb, name, t.type);
        set(out, t.type, n, cols, rb, off);
    }

    // Columns c0 .. c0 + n - 1 of every row (a row-parallel rank's share):
    // ehcuda::column_slice's host copy (whole blocks of the type only).
    void col_slice(const eh_tensor& t, int64_t cols, int64_t rows, int64_t c0, int64_t n, const std::string& tag,
                   ehcuda::WeightRef& out) {
        const size_t rb = check(t, cols, rows);
        const std::string name = std::string(ehp::to_sv(t.name)) + tag;
        std::vector<uint8_t>& buf = copy_buffer();
        const size_t nb = ehcuda::column_slice(t, rows, rb, c0, n, buf);
        const size_t off = at->add(buf.data(), buf.size(), buf.size(), name, t.type);
        set(out, t.type, rows, n, nb, off);
    }

    // Elements off .. off + n - 1 of a vector of total floats (a bias's
    // share); *out null when it is absent and not required.
    void vector_slice(const std::string& name, int64_t total, int64_t off, int64_t n, const float** out, bool required) {
        std::vector<float> v;
        if (!read_floats(name, total, v, required)) {
            *out = nullptr;
            return;
        }
        at->host_floats(std::vector<float>(v.begin() + off, v.begin() + off + n), name + "[slice]",
                        reinterpret_cast<const void**>(out));
    }

    // A matrix of `rows` x `cols` (ggml dims {cols, rows}).
    size_t matrix(const std::string& name, int64_t cols, int64_t rows, ehcuda::WeightRef& out) {
        return matrix(need(name), cols, rows, out);
    }

    size_t matrix(const eh_tensor& t, int64_t cols, int64_t rows, ehcuda::WeightRef& out) {
        const size_t rb = check(t, cols, rows);
        const size_t off = at->add(t.data, t.nbytes, t.nbytes, std::string(ehp::to_sv(t.name)), t.type);
        set(out, t.type, rows, cols, rb, off);
        return off;
    }

    // The tensor is a rows x cols matrix of a type llama-cuda runs, with all
    // its bytes; returns its row bytes.
    size_t check(const eh_tensor& t, int64_t cols, int64_t rows) {
        std::string name(ehp::to_sv(t.name));
        if (t.n_dims < 1 || t.dims[0] != uint64_t(cols) || (t.n_dims > 1 ? t.dims[1] : 1) != uint64_t(rows) ||
            (t.n_dims > 2 && (t.dims[2] != 1 || (t.n_dims > 3 && t.dims[3] != 1))))
            fail("tensor '" + name + "' has shape [" + std::to_string(t.dims[0]) + ", " +
                 std::to_string(t.n_dims > 1 ? t.dims[1] : 1) + "], expected [" + std::to_string(cols) + ", " +
                 std::to_string(rows) + "]");
        if (!ehcuda::matmul_type_supported(t.type))
            throw ehp::Error(EH_UNSUPPORTED, "tensor '" + name + "' has type " + ehp::type_name(t.type) +
                                                 ", which llama-cuda does not support");
        size_t rb = ehcuda::row_bytes(t.type, cols);
        if (rb == 0) fail("tensor '" + name + "': row of " + std::to_string(cols) + " is not whole blocks of " + ehp::type_name(t.type));
        if (rb * size_t(rows) != t.nbytes || !t.data)
            fail("tensor '" + name + "' has " + std::to_string(t.nbytes) + " bytes, expected " + std::to_string(rb * size_t(rows)));
        return rb;
    }

    void set(ehcuda::WeightRef& out, uint32_t type, int64_t rows, int64_t cols, size_t rb, size_t off) {
        out.type = type;
        out.rows = int(rows);
        out.cols = int(cols);
        out.row_bytes = rb;
        at->fix(&out.data, off);
    }

    // A 1-D vector of n floats (norm weights, biases), converted to F32.
    void vector(const std::string& name, int64_t n, const float** out, bool required = true) {
        std::vector<float> v;
        if (!read_floats(name, n, v, required)) {
            *out = nullptr;
            return;
        }
        at->host_floats(std::move(v), name, reinterpret_cast<const void**>(out));
    }

    // An RMSNorm weight, plus norm_shift: Gemma multiplies by (1 + w);
    // llama.cpp's converter stores w + 1, an HF checkpoint w (shift 1).
    void norm(const std::string& name, int64_t n, const float** out) {
        std::vector<float> v;
        read_floats(name, n, v, true);
        for (float& x : v) x += norm_shift;
        at->host_floats(std::move(v), name, reinterpret_cast<const void**>(out));
    }

    float norm_shift = 0.0f;

    bool read_floats(const std::string& name, int64_t n, std::vector<float>& v, bool required) {
        const eh_tensor* t = find(name);
        if (!t) {
            if (required) fail("missing tensor '" + name + "'");
            return false;
        }
        if (t->dims[0] != uint64_t(n) || (t->n_dims > 1 && t->dims[1] != 1))
            fail("tensor '" + name + "' has length " + std::to_string(t->dims[0]) + ", expected " + std::to_string(n));
        v.assign(static_cast<size_t>(n), 0.0f);
        const size_t esz = t->type == EH_TYPE_F32 ? 4 : 2;
        if ((t->type != EH_TYPE_F32 && t->type != EH_TYPE_F16 && t->type != EH_TYPE_BF16) ||
            t->nbytes != esz * size_t(n) || !t->data)
            fail("tensor '" + name + "' must be F32/F16/BF16 with " + std::to_string(n) + " elements");
        for (int64_t i = 0; i < n; ++i) {
            if (t->type == EH_TYPE_F32) {
                std::memcpy(&v[i], static_cast<const char*>(t->data) + 4 * i, 4);
            } else {
                uint16_t h;
                std::memcpy(&h, static_cast<const char*>(t->data) + 2 * i, 2);
                if (t->type == EH_TYPE_F16) {
                    v[i] = half_to_float(h);
                } else {
                    uint32_t bits = uint32_t(h) << 16;
                    std::memcpy(&v[i], &bits, 4);
                }
            }
        }
        return true;
    }
};

// The FFN rows of each of n ranks: as even as whole blocks of every
// layer's ffn_down type allow (its columns are cut where gate and up rows
// are; a Q4_K_M file mixes types by layer), in units of 32 where the width
// allows, so every rank keeps the chunked kernels.
std::vector<int> ffn_split(int n_ff, const std::vector<uint32_t>& down_types, int n) {
    int unit = 1;
    for (uint32_t t : down_types)
        for (int u : {1, 32, 256})
            if (ehcuda::row_bytes(t, u)) {
                unit = std::max(unit, u);
                break;
            }
    if (unit < 32 && n_ff % 32 == 0) unit = 32;
    const int units = n_ff / unit;
    if (units < n)
        throw ehp::Error(EH_UNSUPPORTED, "tensor parallelism: the FFN's " + std::to_string(n_ff) + " rows are " +
                                             std::to_string(units) + " blocks of " + std::to_string(unit) +
                                             ", fewer than the " + std::to_string(n) + " ranks");
    std::vector<int> rows(static_cast<size_t>(n));
    int given = 0;
    for (int r = 0; r < n; ++r) {
        rows[size_t(r)] = (units / n + (r < units % n ? 1 : 0)) * unit;
        given += rows[size_t(r)];
    }
    rows[size_t(n - 1)] += n_ff - given;  // (a width not a whole number of units: the rest to the last)
    return rows;
}

// Every rank's slices of every layer (model.hpp's Shard): Q, K, V rows of
// its heads (and their biases), attn_output's columns of its heads, gate
// and up rows of its FFN share, ffn_down's columns of the same, each in
// its own arena; norm weights and the RoPE divisors (`rope`, may be empty)
// copied into each.
void load_shards(Loader& ld, Model& m, const std::vector<float>& rope, const std::vector<int>& devices) {
    const Config& c = m.cfg;
    const int n = m.tp;
    const int kv_per_rank = ehcuda::kv_heads_per_rank(c.n_kv, n);
    std::vector<uint32_t> down_types;
    for (int i = 0; i < c.n_layer; ++i) down_types.push_back(ld.need("blk." + std::to_string(i) + ".ffn_down.weight").type);
    const std::vector<int> ff = ffn_split(c.n_ff, down_types, n);
    m.shards.resize(size_t(n));
    for (int r = 0, ff0 = 0; r < n; ++r) {
        Shard& s = m.shards[size_t(r)];
        ehcuda::place_shard_heads(s, c, r, kv_per_rank, devices[size_t(r)]);
        s.c.n_ff = ff[size_t(r)];
        s.ff0 = ff0;
        ff0 += s.c.n_ff;
    }
    ld.plan_ranks(m.shards);
    if (!rope.empty())
        for (int r = 0; r < n; ++r)
            ld.ranks[size_t(r)]->host_floats(rope, "rope_freqs[rank " + std::to_string(r) + "]",
                                             reinterpret_cast<const void**>(&m.shards[size_t(r)].rope_freqs));
    for (int i = 0; i < c.n_layer; ++i) {
        const std::string p = "blk." + std::to_string(i) + ".";
        const bool fused_qkv = ld.find(p + "attn_qkv.weight") != nullptr;
        const bool fused_ff = ld.find(p + "ffn_gate.weight") == nullptr;  // phi3: gate | up in ffn_up
        for (int r = 0; r < n; ++r) {
            const Shard& s = m.shards[size_t(r)];
            Layer& L = m.shards[size_t(r)].layers[size_t(i)];
            const std::string tag = "[rank " + std::to_string(r) + "]";
            ld.at = ld.ranks[size_t(r)].get();
            ld.vector(p + "attn_norm.weight", c.n_embd, &L.attn_norm);
            ld.vector(p + "ffn_norm.weight", c.n_embd, &L.ffn_norm);
            if (c.qk_norm) {
                ld.vector(p + "attn_q_norm.weight", c.head_dim, &L.q_norm);
                ld.vector(p + "attn_k_norm.weight", c.head_dim, &L.k_norm);
            }
            // Q, K, V: this rank's heads, at [q | k | v] of its own width.
            const int64_t q0 = int64_t(s.head0) * c.head_dim, k0 = int64_t(s.kv0) * c.head_dim;
            const int64_t first[3] = {q0, c.q_dim() + k0, c.q_dim() + c.kv_dim() + k0};
            const int64_t rows[3] = {s.c.q_dim(), s.c.kv_dim(), s.c.kv_dim()};
            const int64_t full[3] = {c.q_dim(), c.kv_dim(), c.kv_dim()};
            const int offs[3] = {0, s.c.q_dim(), s.c.q_dim() + s.c.kv_dim()};
            const char* names[3] = {"attn_q", "attn_k", "attn_v"};
            L.n_qkv = 3;
            for (int k = 0; k < 3; ++k) {
                if (fused_qkv) {
                    ld.row_slice(ld.need(p + "attn_qkv.weight"), c.n_embd, c.qkv_dim(), first[k], rows[k], tag, L.qkv[k].w);
                    ld.vector_slice(p + "attn_qkv.bias", c.qkv_dim(), first[k], rows[k], &L.qkv[k].bias, false);
                } else {
                    const int64_t f = k == 0 ? q0 : k0;
                    ld.row_slice(ld.need(p + names[k] + ".weight"), c.n_embd, full[k], f, rows[k], tag, L.qkv[k].w);
                    ld.vector_slice(p + names[k] + ".bias", full[k], f, rows[k], &L.qkv[k].bias, false);
                }
                L.qkv[k].out_offset = offs[k];
            }
            ld.col_slice(ld.need(p + "attn_output.weight"), c.q_dim(), c.n_embd, q0, s.c.q_dim(), tag, L.attn_out);
            // gate, up: this rank's FFN rows; down: the same columns.
            L.n_gate_up = 2;
            if (fused_ff) {
                const eh_tensor& gu = ld.need(p + "ffn_up.weight");
                ld.row_slice(gu, c.n_embd, 2 * int64_t(c.n_ff), s.ff0, s.c.n_ff, tag, L.gate_up[0].w);
                ld.row_slice(gu, c.n_embd, 2 * int64_t(c.n_ff), c.n_ff + s.ff0, s.c.n_ff, tag + "[up]", L.gate_up[1].w);
            } else {
                ld.row_slice(ld.need(p + "ffn_gate.weight"), c.n_embd, c.n_ff, s.ff0, s.c.n_ff, tag, L.gate_up[0].w);
                ld.row_slice(ld.need(p + "ffn_up.weight"), c.n_embd, c.n_ff, s.ff0, s.c.n_ff, tag, L.gate_up[1].w);
            }
            L.gate_up[1].out_offset = s.c.n_ff;
            ld.col_slice(ld.need(p + "ffn_down.weight"), c.n_ff, c.n_embd, s.ff0, s.c.n_ff, tag, L.ffn_down);
        }
    }
    ld.at = &ld.plan;
}

// The load's log of the kernel plan: one line per weight-matrix kind and
// launch, and the attention's.
// Gemma 3's layer kinds for the load's log, "" for other models.
std::string gemma_layers(const Config& c) {
    if (!c.gemma) return "";
    int local = 0;
    for (bool b : c.sliding) local += b;
    char buf[256];
    std::snprintf(buf, sizeof buf, " on %d sliding layers (RoPE base %g) of %d; global layers RoPE base %g%s, scale %g",
                  local, double(c.local_freq_base), c.n_layer, double(c.freq_base),
                  c.rope_linear != 1.0f ? (" / linear " + std::to_string(c.rope_linear)).c_str() : "",
                  double(c.scale()));
    return buf;
}

// (rank 0's shapes when sharded: the ranks differ by at most a block of FFN rows)
std::vector<std::string> plan_lines(const Model& m, const ehp::ModelView& view, const ehcuda::DeviceTraits& dev) {
    ehcuda::PlanScope scope(m.plan);
    const Config& c = m.shards.empty() ? m.cfg : m.shards[0].c;
    const std::vector<Layer>& layers = m.shards.empty() ? m.layers : m.shards[0].layers;
    ehcuda::DenseMatrixOptions o;
    o.head_dim = c.head_dim;
    if (!m.shards.empty()) {
        o.q_rows = c.q_dim();
        o.kv_rows = c.kv_dim();
        o.ff_rows = c.n_ff;
    }
    // (the FFN pair's parameters depend on the device: its own line)
    o.ffn_pair = [&](int i, const ehcuda::GemvShape&, const ehcuda::GemvShape&) {
        const Layer& L = layers[size_t(i)];
        ehcuda::MatSeg gate, up;
        gate_up_halves(L, c.n_ff, gate, up);
        std::string pair_kernel = ehcuda::gate_up_swiglu_supported(gate.w, up.w, L.ffn_down)
                                      ? ehcuda::gate_up_swiglu_describe(gate.w, up.w)
                                      : std::string();
        if (const size_t at = pair_kernel.find("with SwiGLU"); c.gemma && at != std::string::npos)
            pair_kernel.replace(at, 11, "with GeLU(tanh) gate");  // the same kernel, Gemma's activation
        return pair_kernel;
    };
    const std::vector<ehcuda::MatrixKind> mats = ehcuda::dense_matrices(view, m.plan, o);
    const std::string hd = "head dim " + std::to_string(c.head_dim) + ", " + std::to_string(c.n_head) + " query / " +
                           std::to_string(c.n_kv) + " KV heads";
    std::vector<std::string> attn = {
        "attention decode: " +
            std::string(ehcuda::attention_head_dim_fast(c.head_dim)
                            ? "rope_attn_decode_kernel (RoPE, KV store, split-K attention and merge in one launch), "
                            : "rope_store_kv + attention_generic (head dim not tiled), ") +
            hd + (c.window ? ", window " + std::to_string(c.window) : "") + gemma_layers(c),
        "attention prefill: attention_prefill (" + hd + ")"};
    if (m.tp > 1)
        attn.push_back(ehcuda::tp_plan_line(m.tp, m.rank_streams,
                                            ", one all-reduce after attn_output and one after ffn_down; per rank:",
                                            m.shards, [](const Shard& s) {
                                                return ", FFN rows " + std::to_string(s.ff0) + "+" +
                                                       std::to_string(s.c.n_ff);
                                            }));
    return ehcuda::plan_log(m.plan, dev, mats, attn);
}

}  // namespace

std::unique_ptr<Model> load_model(const eh_load_params& params) {
    ehp::ModelView view(params.view);
    auto m = std::make_unique<Model>();
    m->cfg = read_config(view);
    m->path = params.path ? params.path : "(model)";
    const std::vector<int> devices = ehcuda::take_devices(*m, params, kMaxDevices);
    const Config& c = m->cfg;
    // (the post-norms need each row-parallel matmul's whole sum before the
    // residual add, which the shard mode's fused all-reduce does not give)
    if (c.gemma && m->tp > 1)
        throw ehp::Error(EH_UNSUPPORTED, "llama-cuda: tensor parallelism is not built for gemma3");
    // (M-RoPE's shift of each rank's heads is not built)
    if (c.mrope.active() && m->tp > 1)
        throw ehp::Error(EH_UNSUPPORTED, "llama-cuda: tensor parallelism is not built for qwen2vl");
    const ehcuda::Options opts(params.options_json);
    opts.check_known({"upload_chunk_bytes", "fp16_weights", "batch_gemm_min_tokens", "kernels", "tensor_parallel"});
    const ehcuda::ShardLoadOptions lo = ehcuda::shard_load_options(opts, devices);
    m->rank_streams = lo.rank_streams;
    const auto progress = ehcuda::load_progress(params);
    const auto cancelled = ehcuda::load_cancelled(params);

    const ehcuda::DeviceTraits dev = ehcuda::describe_device(*m);
    m->plan = ehcuda::load_plan(dev, false, opts);
    // With FP16 mirrors, batched steps of this many tokens or more take
    // cuBLAS (H200, forged Q4_K_M, ms per decode step of n sequences, cuBLAS
    // / one GEMV per token: Qwen2.5-0.5B 1.48 / 1.25 at n = 2, 1.48 / 1.70 at
    // 3, 1.49 / 2.75 at 8; Phi-3-mini 3.60 / 3.50 at 2, 3.63 / 5.52 at 3,
    // 3.89 / 9.57 at 8): the plan's batch_gemv_per_token_mirrored + 1, which
    // this older option sets too.
    m->plan.batch_gemv_per_token_mirrored =
        int(opts.integer("batch_gemm_min_tokens", m->plan.batch_gemv_per_token_mirrored + 1, 2, 65536)) - 1;
    progress(0.0f, "validating");

    Loader ld(*m, view);
    if (c.gemma && ehp::from_safetensors(view)) ld.norm_shift = 1.0f;
    const eh_tensor* emb = view.find_tensor("token_embd.weight");
    if (!emb) fail("missing tensor 'token_embd.weight'");
    if (emb->n_dims < 2 || emb->dims[1] == 0 || emb->dims[1] > (1u << 24)) fail("token_embd.weight: bad vocabulary dimension");
    m->cfg.n_vocab = int(emb->dims[1]);
    ld.matrix(*emb, c.n_embd, c.n_vocab, m->tok_embd);
    ld.norm("output_norm.weight", c.n_embd, &m->output_norm);
    const std::vector<float> rope = c.gemma && c.rope_linear != 1.0f
                                        ? std::vector<float>(size_t(c.n_rot / 2), c.rope_linear)
                                        : ehp::rope_freqs(view, uint32_t(c.n_rot), c.freq_base);
    if (!rope.empty())
        ld.plan.host_floats(rope, c.gemma && c.rope_linear != 1.0f ? "rope linear scaling" : "rope_freqs.weight",
                            reinterpret_cast<const void**>(&m->rope_freqs));
    if (const eh_tensor* out = view.find_tensor("output.weight"))
        ld.matrix(*out, c.n_embd, c.n_vocab, m->output);
    else
        m->output = m->tok_embd;  // tied LM head (filled in after layout)
    const bool tied = !view.find_tensor("output.weight");

    if (m->tp > 1) load_shards(ld, *m, rope, devices);
    else m->layers.resize(size_t(c.n_layer));
    for (int i = 0; i < c.n_layer && m->tp == 1; ++i) {
        Layer& L = m->layers[size_t(i)];
        std::string p = "blk." + std::to_string(i) + ".";
        ld.norm(p + "attn_norm.weight", c.n_embd, &L.attn_norm);
        if (ld.find(p + "attn_qkv.weight")) {
            L.n_qkv = 1;
            ld.matrix(p + "attn_qkv.weight", c.n_embd, c.qkv_dim(), L.qkv[0].w);
            ld.vector(p + "attn_qkv.bias", c.qkv_dim(), &L.qkv[0].bias, false);
        } else {
            L.n_qkv = 3;
            const char* names[3] = {"attn_q", "attn_k", "attn_v"};
            const int rows[3] = {c.q_dim(), c.kv_dim(), c.kv_dim()};
            const int offs[3] = {0, c.q_dim(), c.q_dim() + c.kv_dim()};
            for (int k = 0; k < 3; ++k) {
                ld.matrix(p + names[k] + ".weight", c.n_embd, rows[k], L.qkv[k].w);
                ld.vector(p + names[k] + ".bias", rows[k], &L.qkv[k].bias, false);
                L.qkv[k].out_offset = offs[k];
            }
        }
        if (c.qk_norm) {
            ld.norm(p + "attn_q_norm.weight", c.head_dim, &L.q_norm);
            ld.norm(p + "attn_k_norm.weight", c.head_dim, &L.k_norm);
        }
        ld.matrix(p + "attn_output.weight", c.q_dim(), c.n_embd, L.attn_out);
        ld.norm(p + "ffn_norm.weight", c.n_embd, &L.ffn_norm);
        if (c.gemma) {
            ld.norm(p + "post_attention_norm.weight", c.n_embd, &L.post_attn_norm);
            ld.norm(p + "post_ffw_norm.weight", c.n_embd, &L.post_ffn_norm);
        }
        if (ld.find(p + "ffn_gate.weight")) {
            L.n_gate_up = 2;
            ld.matrix(p + "ffn_gate.weight", c.n_embd, c.n_ff, L.gate_up[0].w);
            ld.matrix(p + "ffn_up.weight", c.n_embd, c.n_ff, L.gate_up[1].w);
            L.gate_up[1].out_offset = c.n_ff;
        } else {
            // phi3: ffn_up holds gate (first n_ff rows) and up together.
            L.n_gate_up = 1;
            ld.matrix(p + "ffn_up.weight", c.n_embd, 2 * int64_t(c.n_ff), L.gate_up[0].w);
        }
        ld.matrix(p + "ffn_down.weight", c.n_ff, c.n_embd, L.ffn_down);
    }
    m->quant_kind = (m->tp > 1 ? *ld.ranks[0] : ld.plan).dominant_type();

    if (cancelled()) throw ehp::Error(EH_CANCELLED, "model load cancelled");
    ehcuda::require_arena_memory(*m, kLoadHeadroom);
    progress(0.02f, "allocating");
    ehcuda::allocate_arenas(*m, ld.plan, ld.ranks);
    if (tied) m->output = m->tok_embd;

    ehcuda::upload_arenas(*m, ld.plan, ld.ranks, lo.chunk_bytes, progress, cancelled);
    ehcuda::Stream stream;

    std::string why = ehcuda::check_kernel_image();
    if (!why.empty()) throw ehp::Error(EH_UNSUPPORTED, why);

    // The matrices multi-token GEMMs read (the embedding lookup keeps the
    // stored table): FP16 copies when the policy says so.
    // (a shard's on its GPU, where its matmuls run)
    auto layer_mats = [](const std::vector<Layer>& layers, std::vector<ehcuda::WeightRef>& mats) {
        for (const Layer& L : layers) {
            for (int k = 0; k < L.n_qkv; ++k) mats.push_back(L.qkv[k].w);
            mats.push_back(L.attn_out);
            for (int k = 0; k < L.n_gate_up; ++k) mats.push_back(L.gate_up[k].w);
            mats.push_back(L.ffn_down);
        }
    };
    std::vector<ehcuda::WeightRef> mats{m->output};
    layer_mats(m->layers, mats);
    ehcuda::MirrorDecision md =
        ehcuda::build_mirrors(*m, mats, layer_mats, lo.mirror_policy, stream.get(), &m->mirrored);
    // Without mirrors, multi-token matmuls dequantize into a slab: one that
    // holds a layer's largest call whole (prefill_slab.hpp), unless the
    // plan's keys say otherwise.
    if (!m->mirrored && m->plan.prefill_dense_slab_mb == 0 && m->plan.prefill_slab_mb == 0) {
        std::vector<size_t> calls;
        for (const Layer& L : m->shards.empty() ? m->layers : m->shards[0].layers) {
            size_t qkv = 0, gate_up = 0;
            for (int k = 0; k < L.n_qkv; ++k) qkv += ehcuda::WeightMirror::bytes_for(L.qkv[k].w);
            for (int k = 0; k < L.n_gate_up; ++k) gate_up += ehcuda::WeightMirror::bytes_for(L.gate_up[k].w);
            calls.insert(calls.end(), {qkv, ehcuda::WeightMirror::bytes_for(L.attn_out), gate_up,
                                       ehcuda::WeightMirror::bytes_for(L.ffn_down)});
        }
        if (const int mb = ehcuda::whole_gemm_slab_mb(calls)) {
            m->plan.prefill_dense_slab_mb = m->plan.prefill_slab_mb = mb;
            md.why += "; prefill slabs of " + std::to_string(mb) + " MiB (a layer's largest matmul whole)";
        }
    }
    for (const std::string& line : plan_lines(*m, view, dev)) progress(0.99f, line.c_str());
    progress(1.0f, ("ready; " + md.why).c_str());
    return m;
}

}  // namespace llama_cuda
