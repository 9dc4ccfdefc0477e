#include "model.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include <engine_host/quant_blocks.hpp>
#include <ehcuda/check.hpp>
#include <ehcuda/device_set.hpp>
#include <ehcuda/graph.hpp>
#include <ehcuda/model_matrices.hpp>
#include <ehcuda/options.hpp>
#include <ehcuda/shard_load.hpp>
#include <ehcuda/tp_group.hpp>
#include <ehcuda/tp_split.hpp>
#include <ehcuda/upload.hpp>
#include <ehcuda/upload_devices.hpp>
#include <ehcuda/weight_plan.hpp>

namespace gpt_cuda {
namespace {

// Headroom checked on top of the weights at load: the batched step's
// activations and a KV pool of a modest context.
constexpr size_t kLoadHeadroom = size_t(64) << 20;
// Rows of some types (Q4_0, Q5_0, Q8_0) are read with aligned 32-bit loads
// that may run 3 bytes past a tensor's end.
constexpr size_t kTailPad = 16;

[[noreturn]] void fail(const std::string& msg) { throw ehp::Error(EH_MODEL_LOAD_FAILED, msg); }

std::string blk(int i, const std::string& what) { return "blk." + std::to_string(i) + "." + what; }

std::string dims_str(const eh_tensor& t) {
    std::string s;
    for (uint32_t d = 0; d < t.n_dims && d < EH_MAX_DIMS; ++d) s += (d ? ", " : "") + std::to_string(t.dims[d]);
    return "{" + s + "}";
}

// Plans the arena and the upload list while checking each tensor's type,
// shape and byte size, so nothing is ever read past the mapping. Sharded
// (tensor parallelism), each rank's pieces go to a plan over its shard's
// arena (`at`), their names tagged with the rank.
class Loader : public ehcuda::ShardedLoader {
public:
    Loader(Model& m, const ehp::ModelView& view) : ShardedLoader(m.arena, view) {}

    // Where the next tensors go: rank r's plan, or (r < 0) the model's.
    void use_rank(int r) {
        at = r < 0 ? &plan : ranks[size_t(r)].get();
        tag = r < 0 ? std::string() : "[rank " + std::to_string(r) + "]";
    }

    bool has(const std::string& name) const { return find(name) != nullptr; }

    // dims {cols, rows, n_expert}; returns the arena offset. Only the
    // flattened rows row0 .. row0 + nrows - 1 of its rows * n_expert are
    // planned (nrows 0: all of them): a rank's Q/K/V rows, or its experts.
    size_t tensor(const eh_tensor& t, uint64_t cols, uint64_t rows, uint64_t n_expert, bool moe_types, size_t* row_bytes,
                  uint64_t row0 = 0, uint64_t nrows = 0) {
        const size_t file_rb = tensor_check(t, cols, rows, n_expert, moe_types, row_bytes);
        const std::string name(ehp::to_sv(t.name));
        if (nrows == 0) nrows = rows * n_expert;
        return add_rows(t, static_cast<const uint8_t*>(t.data) + row0 * file_rb, nrows, cols, file_rb, name + tag);
    }

    // nrows file rows of t's type (file_rb bytes of `cols` values each) from
    // src into the current plan: MXFP4 rewritten at upload into the device
    // layout, any other type as it is. Returns the arena offset.
    size_t add_rows(const eh_tensor& t, const void* src, uint64_t nrows, uint64_t cols, size_t file_rb,
                    const std::string& name) {
        const size_t bytes = file_rb * nrows;
        return t.type == EH_TYPE_MXFP4 ? at->add_mxfp4(src, int64_t(nrows), int64_t(cols), 0, name)
                                       : at->add(src, bytes, bytes + kTailPad, name, t.type);
    }

    // The tensor has dims {cols, rows, n_expert}, a type gpt-cuda runs
    // there and all its bytes; returns its file row bytes, *row_bytes the
    // device's.
    size_t tensor_check(const eh_tensor& t, uint64_t cols, uint64_t rows, uint64_t n_expert, bool moe_types,
                        size_t* row_bytes) {
        const std::string name(ehp::to_sv(t.name));
        const uint64_t want[EH_MAX_DIMS] = {cols, rows, n_expert, 1};
        bool ok = t.n_dims >= 1 && t.n_dims <= EH_MAX_DIMS;
        for (uint32_t d = 0; ok && d < EH_MAX_DIMS; ++d) ok = (d < t.n_dims ? t.dims[d] : 1) == want[d];
        if (!ok)
            fail("tensor '" + name + "' has dims " + dims_str(t) + ", expected {" + std::to_string(cols) + ", " +
                 std::to_string(rows) + (n_expert > 1 ? ", " + std::to_string(n_expert) : std::string()) + "}");
        const bool supported = moe_types ? ehcuda::moe_type_supported(t.type) : ehcuda::matmul_type_supported(t.type);
        if (!supported)
            throw ehp::Error(EH_UNSUPPORTED, "tensor '" + name + "' has type " + ehp::type_name(t.type) +
                                                 ", which gpt-cuda does not support here" +
                                                 (moe_types ? "" : " (MXFP4 is supported for expert tensors only)"));
        // MXFP4 experts: the file's ggml rows, rewritten at upload into the
        // device layout (mxfp4_layout.hpp), whose rows are a little longer.
        const bool mxfp4 = t.type == EH_TYPE_MXFP4;
        const size_t file_rb = mxfp4 ? ehp::quant::row_bytes(t.type, cols) : ehcuda::moe_row_bytes(t.type, int64_t(cols));
        const size_t rb = ehcuda::moe_row_bytes(t.type, int64_t(cols));
        if (rb == 0 || file_rb == 0)
            fail("tensor '" + name + "': row of " + std::to_string(cols) + " is not whole blocks of " + ehp::type_name(t.type));
        const size_t need = file_rb * rows * n_expert;
        if (!t.data || t.nbytes < need)
            fail("tensor '" + name + "' has " + std::to_string(t.nbytes) + " bytes, its shape needs " + std::to_string(need));
        *row_bytes = rb;
        return file_rb;
    }

    void matrix(const std::string& name, int64_t cols, int64_t rows, ehcuda::WeightRef& out) {
        matrix(need(name), cols, rows, out);
    }
    void matrix(const eh_tensor& t, int64_t cols, int64_t rows, ehcuda::WeightRef& out) {
        rows_of(t, cols, rows, 0, rows, out);
    }

    // Rows r0 .. r0 + n - 1 of a rows x cols matrix (a rank's heads) as a
    // matrix of its own; all of them: matrix().
    void row_slice(const std::string& name, int64_t cols, int64_t rows, int64_t r0, int64_t n, ehcuda::WeightRef& out) {
        if (r0 == 0 && n == rows) return matrix(name, cols, rows, out);
        rows_of(need(name), cols, rows, r0, n, out);
    }
    // (both: rows r0 .. r0 + n - 1 of t)
    void rows_of(const eh_tensor& t, int64_t cols, int64_t rows, int64_t r0, int64_t n, ehcuda::WeightRef& out) {
        const size_t off = tensor(t, uint64_t(cols), uint64_t(rows), 1, false, &out.row_bytes, uint64_t(r0), uint64_t(n));
        out.type = t.type;
        out.rows = int(n);
        out.cols = int(cols);
        at->fix(&out.data, off);
    }

    // Columns c0 .. c0 + n - 1 of every row (a row-parallel rank's share:
    // ehcuda::column_slice's host copy, whole blocks of the type only); all
    // of them: matrix().
    void col_slice(const std::string& name, int64_t cols, int64_t rows, int64_t c0, int64_t n, ehcuda::WeightRef& out) {
        if (c0 == 0 && n == cols) return matrix(name, cols, rows, out);
        const eh_tensor& t = need(name);
        size_t rb = 0;
        tensor_check(t, uint64_t(cols), uint64_t(rows), 1, false, &rb);
        std::vector<uint8_t>& buf = copy_buffer();
        out.row_bytes = ehcuda::column_slice(t, rows, rb, c0, n, buf);
        const size_t off = at->add(buf.data(), buf.size(), buf.size() + kTailPad, name + tag, t.type);
        out.type = t.type;
        out.rows = int(rows);
        out.cols = int(n);
        at->fix(&out.data, off);
    }

    // Experts e0 .. e0 + ne - 1 (a rank's; ne 0: all of them).
    void experts(const std::string& name, int64_t cols, int64_t rows_stored, int64_t n_expert, int rows, int row0,
                 ehcuda::ExpertMat& out, int64_t e0 = 0, int64_t ne = 0) {
        const eh_tensor& t = need(name);
        const size_t off = tensor(t, uint64_t(cols), uint64_t(rows_stored), uint64_t(n_expert), true, &out.row_bytes,
                                  uint64_t(e0 * rows_stored), uint64_t(ne * rows_stored));
        out.type = t.type;
        out.rows = rows;
        out.cols = int(cols);
        out.row0 = row0;
        out.expert_stride = out.row_bytes * size_t(rows_stored);
        at->fix(&out.data, off);
    }

    // Tensor parallelism within experts: of each of the n_expert experts'
    // rows_stored rows, rows [first, first + count) of every cut in order (a
    // rank's gate rows, then its up rows of a fused gate|up), copied on the
    // host expert by expert; out's rows are one cut's, from row0 0.
    void expert_rows(const std::string& name, int64_t cols, int64_t rows_stored, int64_t n_expert,
                     const std::vector<ehcuda::RowRange>& cuts, ehcuda::ExpertMat& out) {
        const eh_tensor& t = need(name);
        const size_t file_rb = tensor_check(t, uint64_t(cols), uint64_t(rows_stored), uint64_t(n_expert), true, &out.row_bytes);
        std::vector<uint8_t>& buf = copy_buffer();
        const int64_t per = ehcuda::expert_rows_copy(t.data, file_rb, rows_stored, n_expert, cuts, buf);
        const size_t off = add_rows(t, buf.data(), uint64_t(per * n_expert), uint64_t(cols), file_rb, name + tag);
        out.type = t.type;
        out.rows = int(cuts[0].count);
        out.cols = int(cols);
        out.row0 = 0;
        out.expert_stride = out.row_bytes * size_t(per);
        at->fix(&out.data, off);
    }
    // Columns [c.first, c.first + c.count) of every row of every expert (a
    // rank's share of down within experts: ehcuda::column_slice's host copy
    // of the rows * n_expert rows, whole blocks of the type only).
    void expert_cols(const std::string& name, int64_t cols, int64_t rows, int64_t n_expert, ehcuda::RowRange c,
                     ehcuda::ExpertMat& out) {
        const eh_tensor& t = need(name);
        size_t rb = 0;
        const size_t file_rb = tensor_check(t, uint64_t(cols), uint64_t(rows), uint64_t(n_expert), true, &rb);
        std::vector<uint8_t>& buf = copy_buffer();
        const size_t nb = ehcuda::column_slice(t, rows * n_expert, file_rb, c.first, c.count, buf);
        const size_t off = add_rows(t, buf.data(), uint64_t(rows * n_expert), uint64_t(c.count), nb, name + tag);
        out.type = t.type;
        out.rows = int(rows);
        out.cols = int(c.count);
        out.row_bytes = ehcuda::moe_row_bytes(t.type, c.count);
        out.row0 = 0;
        out.expert_stride = out.row_bytes * size_t(rows);
        at->fix(&out.data, off);
    }

    // n floats (any shape with n elements), converted to F32 on the host.
    // Returns the arena offset, or SIZE_MAX when absent and not required.
    size_t vector(const std::string& name, uint64_t n, const float** out, bool required = true) {
        return vector_slice(name, n, 0, n, out, required);
    }
    // Elements off .. off + len - 1 of a vector of n (a rank's share of a
    // bias, its heads' sinks).
    size_t vector_slice(const std::string& name, uint64_t n, uint64_t off, uint64_t len, const float** out,
                        bool required = true) {
        *out = nullptr;
        std::vector<float> v;
        if (!read_floats(name, n, required, v)) return SIZE_MAX;
        if (len != n) v = std::vector<float>(v.begin() + ptrdiff_t(off), v.begin() + ptrdiff_t(off + len));
        return at->host_floats(std::move(v), len != n ? name + tag : name, reinterpret_cast<const void**>(out));
    }
    // Of a bias of n_expert * per values, each expert's elements of every cut
    // in order (the biases of expert_rows' rows). Returns the arena offset,
    // or SIZE_MAX when absent (not required).
    size_t expert_bias_rows(const std::string& name, int64_t n_expert, int64_t per,
                            const std::vector<ehcuda::RowRange>& cuts, const float** out) {
        *out = nullptr;
        std::vector<float> v;
        if (!read_floats(name, uint64_t(n_expert * per), false, v)) return SIZE_MAX;
        std::vector<uint8_t> bytes;
        const int64_t kept = ehcuda::expert_rows_copy(v.data(), 4, per, n_expert, cuts, bytes);
        std::vector<float> own(size_t(kept * n_expert));
        std::memcpy(own.data(), bytes.data(), bytes.size());
        return at->host_floats(std::move(own), name + tag, reinterpret_cast<const void**>(out));
    }
    // The n values of `name` as floats into v; false when it is absent and
    // not required.
    bool read_floats(const std::string& name, uint64_t n, bool required, std::vector<float>& v) {
        const eh_tensor* t = find(name);
        if (!t) {
            if (required) fail("missing tensor '" + name + "'");
            return false;
        }
        uint64_t count = 1;
        for (uint32_t d = 0; d < t->n_dims && d < EH_MAX_DIMS; ++d) count *= t->dims[d];
        if (count != n) fail("tensor '" + name + "' has " + std::to_string(count) + " elements, expected " + std::to_string(n));
        if (!ehp::quant::can_dequantize(t->type))
            throw ehp::Error(EH_UNSUPPORTED, "tensor '" + name + "' has type " + ehp::type_name(t->type));
        const uint64_t bytes = ehp::quant::row_bytes(t->type, n);
        if (bytes == 0 || !t->data || t->nbytes < bytes) fail("tensor '" + name + "' is too short for " + std::to_string(n) + " values");
        v.resize(n);
        ehp::quant::dequantize_row(t->type, t->data, v.data(), n);
        return true;
    }

    std::string tag;  // appended to the names of its pieces (rank r's)
};

const void** slot(const float** p) { return reinterpret_cast<const void**>(p); }

void bind_gpt2_layer(Loader& ld, const Config& c, int i, Layer& L) {
    const int E = c.n_embd, F = c.n_ff;
    ld.vector(blk(i, "attn_norm.weight"), E, &L.attn_norm);
    ld.vector(blk(i, "attn_norm.bias"), E, &L.attn_norm_b);
    if (ld.has(blk(i, "attn_qkv.weight"))) {
        L.n_qkv = 1;
        ld.matrix(blk(i, "attn_qkv.weight"), E, c.qkv_dim(), L.qkv[0].w);
        ld.vector(blk(i, "attn_qkv.bias"), uint64_t(c.qkv_dim()), &L.qkv[0].bias, false);
    } else {
        L.n_qkv = 3;
        const char* names[3] = {"attn_q", "attn_k", "attn_v"};
        const int rows[3] = {c.q_dim(), c.kv_dim(), c.kv_dim()};
        const int offs[3] = {0, c.q_dim(), c.q_dim() + c.kv_dim()};
        for (int k = 0; k < 3; ++k) {
            ld.matrix(blk(i, std::string(names[k]) + ".weight"), E, rows[k], L.qkv[k].w);
            ld.vector(blk(i, std::string(names[k]) + ".bias"), uint64_t(rows[k]), &L.qkv[k].bias, false);
            L.qkv[k].out_offset = offs[k];
        }
    }
    ld.matrix(blk(i, "attn_output.weight"), c.q_dim(), E, L.attn_out.w);
    ld.vector(blk(i, "attn_output.bias"), uint64_t(E), &L.attn_out.bias, false);
    ld.vector(blk(i, "ffn_norm.weight"), E, &L.ffn_norm);
    ld.vector(blk(i, "ffn_norm.bias"), E, &L.ffn_norm_b);
    ld.matrix(blk(i, "ffn_up.weight"), E, F, L.ffn_up.w);
    ld.vector(blk(i, "ffn_up.bias"), uint64_t(F), &L.ffn_up.bias, false);
    ld.matrix(blk(i, "ffn_down.weight"), F, E, L.ffn_down.w);
    ld.vector(blk(i, "ffn_down.bias"), uint64_t(E), &L.ffn_down.bias, false);
}

// What a rank holds of every MoE layer: query heads [head0, head0 +
// n_head), their KV heads [kv0, kv0 + n_kv), experts [expert0, expert0 +
// n_expert), rows [ff0, ff0 + n_ff) of each one's width (all of them but
// within experts); `first` whether attn_output's bias (and within experts
// down's) is its to add. The whole model at tp 1.
struct Part {
    int head0 = 0, n_head = 0, kv0 = 0, n_kv = 0, expert0 = 0, n_expert = 0;
    bool first = true;
    int ff0 = 0, n_ff = 0;
};
Part whole(const Config& c) { return Part{0, c.n_head, 0, c.n_kv, 0, c.n_expert, true, 0, c.n_ff_exp}; }

// Whole experts [expert0, expert0 + n_expert) with their biases (a down
// bias added by the rank holding its expert).
void bind_whole_experts(Loader& ld, const Config& c, const Part& pt, int i, Layer& L) {
    const int E = c.n_embd, F = c.n_ff_exp, X = c.n_expert;
    const int e0 = pt.expert0, ne = pt.n_expert;
    if (ld.has(blk(i, "ffn_gate_up_exps.weight"))) {
        // each expert's gate rows, then its up rows
        ld.experts(blk(i, "ffn_gate_up_exps.weight"), E, 2 * int64_t(F), X, F, 0, L.gate_exps, e0, ne);
        L.up_exps = L.gate_exps;
        L.up_exps.row0 = F;
        const size_t boff = ld.vector_slice(blk(i, "ffn_gate_up_exps.bias"), uint64_t(2) * F * X, uint64_t(2) * F * e0,
                                            uint64_t(2) * F * ne, &L.gate_exps.bias, false);
        if (boff != SIZE_MAX) {
            ld.at->fix(slot(&L.up_exps.bias), boff + size_t(F) * 4);
            L.gate_exps.bias_stride = L.up_exps.bias_stride = 2 * F;
        }
    } else {
        ld.experts(blk(i, "ffn_gate_exps.weight"), E, F, X, F, 0, L.gate_exps, e0, ne);
        ld.experts(blk(i, "ffn_up_exps.weight"), E, F, X, F, 0, L.up_exps, e0, ne);
        if (ld.vector_slice(blk(i, "ffn_gate_exps.bias"), uint64_t(F) * X, uint64_t(F) * e0, uint64_t(F) * ne,
                            &L.gate_exps.bias, false) != SIZE_MAX)
            L.gate_exps.bias_stride = F;
        if (ld.vector_slice(blk(i, "ffn_up_exps.bias"), uint64_t(F) * X, uint64_t(F) * e0, uint64_t(F) * ne,
                            &L.up_exps.bias, false) != SIZE_MAX)
            L.up_exps.bias_stride = F;
    }
    ld.experts(blk(i, "ffn_down_exps.weight"), F, E, X, E, 0, L.down_exps, e0, ne);
    // (each expert's down bias with it: added once, by the rank holding it)
    if (ld.vector_slice(blk(i, "ffn_down_exps.bias"), uint64_t(E) * X, uint64_t(E) * e0, uint64_t(E) * ne,
                        &L.down_exps.bias, false) != SIZE_MAX)
        L.down_exps.bias_stride = E;
}

// Tensor parallelism within experts: every expert, rows [ff0, ff0 + n_ff)
// of its gate and up (of a fused gate|up both halves': per expert the
// rank's gate rows, then its up rows, so the kernels see a fused pair of
// width n_ff) with their biases, the same columns of its down; down's bias
// on the first rank alone (the all-reduce adds it once). The activation
// (gpt-oss's clamped SwiGLU too) is per intermediate row, so each rank's
// rows compute what they do whole.
void bind_expert_rows(Loader& ld, const Config& c, const Part& pt, int i, Layer& L) {
    const int E = c.n_embd, F = c.n_ff_exp, X = c.n_expert;
    const ehcuda::RowRange own{pt.ff0, pt.n_ff};
    if (ld.has(blk(i, "ffn_gate_up_exps.weight"))) {
        const std::vector<ehcuda::RowRange> cuts{own, {F + pt.ff0, pt.n_ff}};
        ld.expert_rows(blk(i, "ffn_gate_up_exps.weight"), E, 2 * int64_t(F), X, cuts, L.gate_exps);
        L.up_exps = L.gate_exps;
        L.up_exps.row0 = pt.n_ff;
        const size_t boff = ld.expert_bias_rows(blk(i, "ffn_gate_up_exps.bias"), X, 2 * int64_t(F), cuts, &L.gate_exps.bias);
        if (boff != SIZE_MAX) {
            ld.at->fix(slot(&L.up_exps.bias), boff + size_t(pt.n_ff) * 4);
            L.gate_exps.bias_stride = L.up_exps.bias_stride = 2 * pt.n_ff;
        }
    } else {
        for (const auto& [name, mat] : {std::pair{"ffn_gate_exps", &L.gate_exps}, std::pair{"ffn_up_exps", &L.up_exps}}) {
            ld.expert_rows(blk(i, std::string(name) + ".weight"), E, F, X, {own}, *mat);
            if (ld.expert_bias_rows(blk(i, std::string(name) + ".bias"), X, F, {own}, &mat->bias) != SIZE_MAX)
                mat->bias_stride = pt.n_ff;
        }
    }
    ld.expert_cols(blk(i, "ffn_down_exps.weight"), F, E, X, own, L.down_exps);
    if (pt.first && ld.vector(blk(i, "ffn_down_exps.bias"), uint64_t(E) * X, &L.down_exps.bias, false) != SIZE_MAX)
        L.down_exps.bias_stride = E;
}

// gpt-oss and qwen3moe: the tensors the other lacks are optional (biases,
// sinks; the per-head norms are required when the config asks for them).
// Sharded, a rank's rows of Q/K/V (and their biases) and its heads'
// columns of attn_output and sinks, its experts whole or its rows of every
// expert (and their biases); norms and the router whole on every rank.
void bind_moe_layer(Loader& ld, const Config& c, const Part& pt, int i, Layer& L) {
    const int E = c.n_embd, X = c.n_expert, D = c.head_dim;
    ld.vector(blk(i, "attn_norm.weight"), E, &L.attn_norm);
    L.n_qkv = 3;
    const char* names[3] = {"attn_q", "attn_k", "attn_v"};
    const int full[3] = {c.q_dim(), c.kv_dim(), c.kv_dim()};
    const int first[3] = {pt.head0 * D, pt.kv0 * D, pt.kv0 * D};
    const int rows[3] = {pt.n_head * D, pt.n_kv * D, pt.n_kv * D};
    const int offs[3] = {0, rows[0], rows[0] + rows[1]};
    for (int k = 0; k < 3; ++k) {
        ld.row_slice(blk(i, std::string(names[k]) + ".weight"), E, full[k], first[k], rows[k], L.qkv[k].w);
        ld.vector_slice(blk(i, std::string(names[k]) + ".bias"), uint64_t(full[k]), uint64_t(first[k]), uint64_t(rows[k]),
                        &L.qkv[k].bias, false);
        L.qkv[k].out_offset = offs[k];
    }
    if (c.qk_norm) {
        ld.vector(blk(i, "attn_q_norm.weight"), uint64_t(c.head_dim), &L.q_norm);
        ld.vector(blk(i, "attn_k_norm.weight"), uint64_t(c.head_dim), &L.k_norm);
    }
    ld.col_slice(blk(i, "attn_output.weight"), c.q_dim(), E, first[0], rows[0], L.attn_out.w);
    if (pt.first) ld.vector(blk(i, "attn_output.bias"), uint64_t(E), &L.attn_out.bias, false);
    for (const char* sinks : {"attn_sinks.weight", "attn_sinks"})
        if (ld.has(blk(i, sinks))) {
            ld.vector_slice(blk(i, sinks), uint64_t(c.n_head), uint64_t(pt.head0), uint64_t(pt.n_head), &L.sinks);
            break;
        }
    const std::string norm = ld.has(blk(i, "ffn_norm.weight")) ? "ffn_norm.weight" : "post_attention_norm.weight";
    ld.vector(blk(i, norm), E, &L.ffn_norm);

    ld.matrix(blk(i, "ffn_gate_inp.weight"), E, X, L.router.w);
    ld.vector(blk(i, "ffn_gate_inp.bias"), uint64_t(X), &L.router.bias, false);
    if (pt.n_ff < c.n_ff_exp) bind_expert_rows(ld, c, pt, i, L);
    else bind_whole_experts(ld, c, pt, i, L);
    L.window = c.layer_window(i);
}

// The load's log of the kernel plan: one line per weight-matrix kind and
// launch (the list `engine-host inspect --kernels` prints, with this
// model's experts as the device's predicates take them), and the
// attention's.
std::vector<std::string> plan_lines(const Model& m, const ehp::ModelView& view, const ehcuda::DeviceTraits& dev) {
    ehcuda::PlanScope scope(m.plan);
    const Config& c = m.cfg;
    const ehcuda::KernelPlan& p = m.plan;
    ehcuda::GptMatrixOptions o;
    // (rank 0's experts when sharded: every rank's are of the same types and shapes)
    const std::vector<Layer>& layers = m.shards.empty() ? m.layers : m.shards[0].layers;
    o.forms = [&](int i, const ehcuda::ExpertLayer&) {
        const Layer& L = layers[size_t(i)];
        ehcuda::ExpertForms f;
        f.decode = ehcuda::moe_decode_supported(L.gate_exps, L.up_exps, L.down_exps, c.n_expert_used);
        f.grouped = ehcuda::moe_grouped_supported(L.gate_exps, L.up_exps, L.down_exps, c.n_expert_used);
        f.tensor_cores = ehcuda::moe_grouped_on_tensor_cores(L.gate_exps, L.up_exps, L.down_exps);
        f.router_kernel = router_decode(m, L);
        return f;
    };
    const std::vector<ehcuda::StepMatrix> mats = ehcuda::gpt_matrices(view, p, o);
    const std::string hd = "head dim " + std::to_string(c.head_dim) + ", " + std::to_string(c.n_head) + " query / " +
                           std::to_string(c.n_kv) + " KV heads";
    std::vector<std::string> attn = {
        "attention decode: " +
            std::string(!c.moe() || !ehcuda::attention_head_dim_fast(c.head_dim)
                            ? "rope_table_store_kv + attention_paged, "
                        : c.arch == Arch::GptOss ? "rope_attn_decode_kernel, paged (RoPE table, KV store, split-K with sinks), "
                                                 : "rope_attn_decode_kernel, paged (QK-norm, RoPE table, KV store, split-K), ") +
            hd};
    if (m.tp > 1)
        attn.push_back(ehcuda::tp_plan_line(
            m.tp, m.rank_streams,
            m.expert_rows ? ", attention by KV head, every expert on every rank with its width split (tensor parallelism "
                            "within experts: gate and up rows, down's columns; every rank routes alike, no filter), "
                            "one all-reduce after attn_output and one after the experts; per rank:"
                          : ", attention by KV head, experts whole per rank (expert parallelism; every rank routes "
                            "alike), one all-reduce after attn_output and one after the experts; per rank:",
            m.shards, [&](const Shard& s) {
                return m.expert_rows ? ", expert rows " + std::to_string(s.ff0) + "+" + std::to_string(s.c.n_ff_exp)
                                     : ", experts " + std::to_string(s.expert0) + "+" + std::to_string(s.n_local);
            }));
    std::vector<std::string> lines{ehcuda::describe_plan(p, dev)};
    lines.insert(lines.end(), attn.begin(), attn.end());
    for (std::string& l : ehcuda::step_route_lines(p, dev, mats, 1, false)) lines.push_back(std::move(l));
    return lines;
}

// Every rank's pieces of every layer (model.hpp's Shard, bind_moe_layer's
// Part), each in its own arena, with its copy of the RoPE table.
void load_shards(Loader& ld, Model& m, const std::vector<int>& devices) {
    const Config& c = m.cfg;
    const int n = m.tp;
    const int kv = ehcuda::kv_heads_per_rank(c.n_kv, n);
    m.shards.resize(size_t(n));
    for (int r = 0; r < n; ++r) {
        Shard& s = m.shards[size_t(r)];
        ehcuda::place_shard_heads(s, c, r, kv, devices[size_t(r)]);
        if (m.expert_rows) {
            // every layer's down cut alike (checked on each: a Q4_K_M file mixes types by layer)
            ehcuda::RowRange own;
            for (int i = 0; i < c.n_layer; ++i)
                own = ehcuda::expert_row_range(ld.need(blk(i, "ffn_down_exps.weight")), c.n_ff_exp, n, r);
            s.n_local = c.n_expert;
            s.ff0 = int(own.first);
            s.c.n_ff_exp = int(own.count);
        } else {
            const ehcuda::ExpertRange er = ehcuda::expert_range(c.n_expert, n, r);
            s.expert0 = er.first;
            s.n_local = er.count;
        }
    }
    ld.plan_ranks(m.shards);
    for (int r = 0; r < n; ++r) {
        Shard& s = m.shards[size_t(r)];
        ld.use_rank(r);
        if (c.n_rot > 0) ld.at->host_floats(c.inv_freq, "rope inverse frequencies" + ld.tag, slot(&s.inv_freq));
        const Part pt{s.head0, s.c.n_head, s.kv0, s.c.n_kv, s.expert0, s.n_local, r == 0, s.ff0, s.c.n_ff_exp};
        for (int i = 0; i < c.n_layer; ++i) bind_moe_layer(ld, c, pt, i, s.layers[size_t(i)]);
    }
    ld.use_rank(-1);
}

}  // namespace

std::unique_ptr<Model> load_model(const eh_load_params& params) {
    ehp::ModelView view(params.view);
    auto m = std::make_unique<Model>();
    m->cfg = read_config(view);
    m->path = params.path && *params.path ? params.path : "(model)";
    const std::vector<int> devices = ehcuda::take_devices(*m, params, kMaxDevices);
    Config& c = m->cfg;
    if (c.arch == Arch::Gpt2 && m->tp > 1)
        throw ehp::Error(EH_UNSUPPORTED, "gpt-cuda: tensor parallelism is not built for gpt2 (gpt-oss and qwen3moe only)");
    const ehcuda::Options opts(params.options_json);
    opts.check_known(
        {"upload_chunk_bytes", "fp16_weights", "kernels", "batch_invariant", "tensor_parallel", "expert_split"});
    // How a tensor-parallel load splits the experts: "experts" (whole experts
    // per rank) or "rows" (every expert on every rank, its width split). One
    // rank splits nothing either way.
    m->expert_rows = opts.choice("expert_split", 0, {"experts", "rows"}) == 1 && m->tp > 1;
    const ehcuda::ShardLoadOptions lo = ehcuda::shard_load_options(opts, devices);
    m->rank_streams = lo.rank_streams;
    const auto progress = ehcuda::load_progress(params);
    const auto cancelled = ehcuda::load_cancelled(params);

    const ehcuda::DeviceTraits dev = ehcuda::describe_device(*m);
    // gpt-oss's top-4 routing must not flip on the GEMV input's int16
    // rounding: the plan takes int16x2 (choose_plan's exact_routing). GPT-2
    // shares the plugin and the choice.
    m->plan = ehcuda::load_plan(dev, true, opts);
    m->batch_invariant = opts.boolean("batch_invariant", false);
    // (its one-token form routes inside moe_decode_mma, which has no
    // expert-range filter, and its sums would change with the rank count)
    if (m->batch_invariant && m->tp > 1)
        throw ehp::Error(EH_UNSUPPORTED, "gpt-cuda: batch_invariant is not built for tensor parallelism; load the model "
                                         "on one device");
    if (m->batch_invariant) {
        // The 64-token MXFP4 gate|up pass splits K two ways, the others four:
        // one split for every pass keeps a row's sums whatever its expert's
        // share of the step.
        m->plan.moe_long_pass_tokens = 65536;
        if (m->plan.batch_moe_grouped_max < 2)
            throw ehp::Error(EH_INVALID_ARGUMENT,
                             "batch_invariant needs the grouped expert kernels: kernels.batch_moe_grouped_max must be >= 2");
    }
    progress(0.0f, "validating");

    Loader ld(*m, view);
    const eh_tensor* emb = view.find_tensor("token_embd.weight");
    if (!emb) fail("missing tensor 'token_embd.weight'");
    if (emb->n_dims < 2 || emb->dims[1] == 0 || emb->dims[1] > (1u << 24)) fail("token_embd.weight: bad vocabulary dimension");
    c.n_vocab = int(emb->dims[1]);
    ld.matrix(*emb, c.n_embd, c.n_vocab, m->tok_embd);
    if (c.arch == Arch::Gpt2) {
        const eh_tensor* pe = view.find_tensor("position_embd.weight");
        if (!pe || pe->n_dims < 2 || pe->dims[1] == 0 || pe->dims[1] > (1u << 24)) fail("missing tensor 'position_embd.weight'");
        ld.matrix(*pe, c.n_embd, int64_t(pe->dims[1]), m->pos_embd);
        if (c.n_ctx_train == 0 || uint64_t(c.n_ctx_train) > pe->dims[1]) c.n_ctx_train = int(pe->dims[1]);
    } else if (c.n_rot > 0) {
        ld.plan.host_floats(c.inv_freq, "rope inverse frequencies", slot(&m->inv_freq));
    }
    ld.vector("output_norm.weight", uint64_t(c.n_embd), &m->output_norm);
    ld.vector("output_norm.bias", uint64_t(c.n_embd), &m->output_norm_b, c.arch == Arch::Gpt2);
    const bool tied = !view.find_tensor("output.weight");
    if (!tied) ld.matrix("output.weight", c.n_embd, c.n_vocab, m->output);

    if (m->tp > 1) {
        load_shards(ld, *m, devices);
    } else {
        m->layers.resize(size_t(c.n_layer));
        for (int i = 0; i < c.n_layer; ++i) {
            if (c.arch == Arch::Gpt2) bind_gpt2_layer(ld, c, i, m->layers[size_t(i)]);
            else bind_moe_layer(ld, c, whole(c), i, m->layers[size_t(i)]);
        }
    }
    m->quant_kind = (m->tp > 1 ? *ld.ranks[0] : ld.plan).dominant_type();
    if (cancelled()) throw ehp::Error(EH_CANCELLED, "model load cancelled");
    ehcuda::require_arena_memory(*m, kLoadHeadroom);
    progress(0.02f, "allocating");
    ehcuda::allocate_arenas(*m, ld.plan, ld.ranks);
    if (tied) m->output = m->tok_embd;
    auto fuse_gate_up = [](std::vector<Layer>& layers) {
        for (auto& L : layers)
            if (L.up_exps.row0 != 0) L.up_exps.data = L.gate_exps.data;  // fused gate|up: same tensor
    };
    fuse_gate_up(m->layers);
    for (Shard& s : m->shards) fuse_gate_up(s.layers);

    ehcuda::upload_arenas(*m, ld.plan, ld.ranks, lo.chunk_bytes, progress, cancelled);
    ehcuda::Stream stream;

    std::string why = ehcuda::check_kernel_image();
    if (!why.empty()) throw ehp::Error(EH_UNSUPPORTED, why);

    // The dense matrices multi-token GEMMs read: FP16 copies when the policy
    // says so (weight_mirror.hpp).
    // (a shard's on its GPU, where its matmuls run)
    auto layer_mats = [](const std::vector<Layer>& layers, std::vector<ehcuda::WeightRef>& mats) {
        for (const Layer& L : layers) {
            for (int k = 0; k < L.n_qkv; ++k) mats.push_back(L.qkv[k].w);
            for (const ehcuda::MatSeg* g : {&L.attn_out, &L.ffn_up, &L.ffn_down, &L.router})
                if (g->w.data) mats.push_back(g->w);
        }
    };
    std::vector<ehcuda::WeightRef> mats{m->output};
    layer_mats(m->layers, mats);
    const ehcuda::MirrorDecision md = ehcuda::build_mirrors(*m, mats, layer_mats, lo.mirror_policy, stream.get());
    for (const std::string& line : plan_lines(*m, view, dev)) progress(0.99f, line.c_str());
    progress(1.0f, ("ready; " + md.why).c_str());
    return m;
}

ehcuda::MoeDecodeArgs moe_decode_args(const Config& c, const Layer& L, float* h, const float* logits, int32_t* route_ids,
                                      float* route_weights, void* scratch, size_t scratch_bytes) {
    ehcuda::MoeDecodeArgs md;
    set_expert_args(md, c, L, scratch, scratch_bytes, h);
    md.x = h;
    md.norm_w = L.ffn_norm;
    md.norm_eps = c.eps;
    md.logits = logits;
    md.route_ids = route_ids;
    md.route_weights = route_weights;
    return md;
}

ehcuda::MoeRouterArgs router_decode_args(const Config& c, const Layer& L, const float* h, float* logits, int32_t* ids,
                                         float* weights, int* counter) {
    ehcuda::MoeRouterArgs ra;
    set_router_args(ra, c, L, h, logits);
    ra.k = c.n_expert_used;
    ra.ids = ids;
    ra.weights = weights;
    ra.counter = counter;
    return ra;
}

ehcuda::MoeGroupedArgs moe_grouped_args(const Config& c, const Layer& L, const float* xn, int ntok, const int32_t* ids,
                                        const float* wts, float* h, void* scratch, size_t scratch_bytes) {
    ehcuda::MoeGroupedArgs g;
    set_expert_args(g, c, L, scratch, scratch_bytes, h);
    g.x = xn;
    g.ldx = c.n_embd;
    g.ntok = ntok;
    g.ids = ids;
    g.weights = wts;
    g.ldh = c.n_embd;
    return g;
}

}  // namespace gpt_cuda
