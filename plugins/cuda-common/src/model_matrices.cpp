#include "ehcuda/model_matrices.hpp"

#include "ehcuda/kernel_route.hpp"

namespace ehcuda {

namespace {

[[noreturn]] void bad(const std::string& why) { throw ehp::Error(EH_MODEL_LOAD_FAILED, why); }

// A 2-D tensor's shape as one GEMV segment: rows of its dims[1], cols of dims[0].
struct Matrix {
    uint32_t type = 0;
    int rows = 0, cols = 0;
};

Matrix matrix(const ehp::ModelView& v, const std::string& name) {
    const eh_tensor* t = v.find_tensor(name);
    if (!t) bad("missing tensor '" + name + "'");
    if (t->n_dims != 2 || t->dims[0] == 0 || t->dims[1] == 0 || t->dims[0] > (1u << 30) || t->dims[1] > (1u << 30))
        bad("tensor '" + name + "' is not a matrix");
    return {t->type, int(t->dims[1]), int(t->dims[0])};
}

// Segments of one input width; rows[s] of the matrix's type each.
GemvShape segments(const Matrix* m, const int* rows, int n) {
    GemvShape g;
    g.nseg = n;
    g.cols = m[0].cols;
    for (int s = 0; s < n; ++s) {
        g.type[s] = m[s].type;
        g.rows[s] = rows[s];
        g.row_bytes[s] = row_bytes(m[s].type, g.cols);
    }
    return g;
}

GemvShape one(const Matrix& m, int cols) {
    GemvShape g;
    g.type[0] = m.type;
    g.rows[0] = m.rows;
    g.cols = cols;
    g.row_bytes[0] = row_bytes(m.type, cols);
    return g;
}

std::string blk(int i, const char* what) { return "blk." + std::to_string(i) + "." + what; }

// A stack of experts {cols, rows, n_expert}: its type and per-expert rows.
// (Trailing dims of 1 may be left out or written, as gpt-cuda's loader
// takes them.)
Matrix experts(const ehp::ModelView& v, const std::string& name, int cols, int n_expert) {
    const eh_tensor* t = v.find_tensor(name);
    if (!t) bad("missing tensor '" + name + "'");
    auto dim = [&](uint32_t d) { return d < t->n_dims ? t->dims[d] : uint64_t(1); };
    if (t->n_dims < 2 || t->n_dims > EH_MAX_DIMS || dim(0) != uint64_t(cols) || dim(2) != uint64_t(n_expert) ||
        dim(3) != 1 || dim(1) == 0 || dim(1) > (1u << 30))
        bad("tensor '" + name + "' is not a stack of " + std::to_string(n_expert) + " experts of " + std::to_string(cols) +
            " inputs");
    return {t->type, int(t->dims[1]), cols};
}

// metadata key `k` of the architecture, 1 .. 2^30
int count_key(const ehp::ModelView& v, const char* k) {
    const uint64_t n = v.require_uint(v.arch_key(k));
    if (n == 0 || n > (1u << 30)) bad(v.arch_key(k) + " out of range");
    return int(n);
}

}  // namespace

std::vector<MatrixKind> dense_matrices(const ehp::ModelView& v, const KernelPlan& p, const DenseMatrixOptions& o) {
    const uint64_t n_layer = v.require_uint(v.arch_key("block_count"));
    const uint64_t n_head = v.require_uint(v.arch_key("attention.head_count"));
    const uint64_t n_kv = v.get_uint(v.arch_key("attention.head_count_kv")).value_or(n_head);
    if (n_layer == 0 || n_layer > 4096 || n_head == 0 || n_kv == 0 || n_kv > n_head)
        bad("block_count or head counts out of range");
    const bool fused_attn = attention_head_dim_fast(o.head_dim);
    const char* act = v.architecture() == "gemma3" ? "GeLU(tanh) gate" : "SwiGLU";
    std::vector<MatrixKind> mats;
    for (int i = 0; i < int(n_layer); ++i) {
        // Q, K, V: three tensors, or one (one segment; split by the head
        // counts where sharded).
        Matrix qkv[3];
        int full[3];
        const bool fused_qkv = v.find_tensor(blk(i, "attn_qkv.weight")) != nullptr;
        if (fused_qkv) {
            const Matrix m = matrix(v, blk(i, "attn_qkv.weight"));
            const int64_t per = int64_t(m.rows) / int64_t(n_head + 2 * n_kv);
            if (per <= 0 || per * int64_t(n_head + 2 * n_kv) != m.rows) bad(blk(i, "attn_qkv.weight") + ": rows not whole heads");
            qkv[0] = qkv[1] = qkv[2] = m;
            full[0] = int(per * n_head);
            full[1] = full[2] = int(per * n_kv);
        } else {
            const char* names[3] = {"attn_q.weight", "attn_k.weight", "attn_v.weight"};
            for (int k = 0; k < 3; ++k) {
                qkv[k] = matrix(v, blk(i, names[k]));
                full[k] = qkv[k].rows;
            }
        }
        const int rows[3] = {o.q_rows ? o.q_rows : full[0], o.kv_rows ? o.kv_rows : full[1], o.kv_rows ? o.kv_rows : full[2]};
        const int all = rows[0] + rows[1] + rows[2];
        mats.push_back({"attn_qkv", fused_qkv && !o.q_rows ? segments(qkv, &all, 1) : segments(qkv, rows, 3), false, ""});
        // (as the batched step's decode: the fused attention leaves chunks)
        const Matrix out = matrix(v, blk(i, "attn_output.weight"));
        mats.push_back({"attn_output", one(out, rows[0]), fused_attn && takes_chunks(p, out.type), ""});
        // gate, up: two tensors, or phi3's one of both halves (one segment
        // unless sharded)
        Matrix gu[2];
        int ff;
        const bool fused_ff = !v.find_tensor(blk(i, "ffn_gate.weight"));
        if (!fused_ff) {
            gu[0] = matrix(v, blk(i, "ffn_gate.weight"));
            gu[1] = matrix(v, blk(i, "ffn_up.weight"));
            ff = gu[0].rows;
        } else {
            gu[0] = gu[1] = matrix(v, blk(i, "ffn_up.weight"));
            if (gu[0].rows % 2) bad(blk(i, "ffn_up.weight") + ": fused gate|up of odd rows");
            ff = gu[0].rows / 2;
        }
        if (o.ff_rows) ff = o.ff_rows;
        const int ffr[2] = {ff, ff};
        const GemvShape gate_up = segments(gu, ffr, 2);
        const int both = 2 * ff;
        const GemvShape matmul = fused_ff && !o.ff_rows ? segments(gu, &both, 1) : gate_up;
        const GemvShape down = one(matrix(v, blk(i, "ffn_down.weight")), ff);
        const std::string pair =
            o.ffn_pair ? o.ffn_pair(i, gate_up, down)
            : can_implement_pair(p, gate_up, &down)
                ? ""
                : std::string("gate_up_pair_kernel with ") + act +
                      " (rows per warp and slices in flight chosen on the device)";
        mats.push_back({"ffn_gate_up", matmul, false, pair});
        mats.push_back({"ffn_down", down, !pair.empty(), ""});
    }
    const Matrix head = v.find_tensor("output.weight") ? matrix(v, "output.weight") : matrix(v, "token_embd.weight");
    mats.push_back({"output", one(head, head.cols), false, ""});
    return mats;
}

std::vector<StepMatrix> gpt_matrices(const ehp::ModelView& v, const KernelPlan& p, const GptMatrixOptions& o) {
    const bool moe = v.architecture() != "gpt2";
    const int n_layer = count_key(v, "block_count"), n_embd = count_key(v, "embedding_length");
    const int n_head = count_key(v, "attention.head_count");
    const int head_dim = int(v.get_uint(v.arch_key("attention.key_length")).value_or(uint64_t(n_embd / n_head)));
    std::vector<StepMatrix> mats;
    auto dense = [&](const char* kind, const GemvShape& g, bool chunks = false, std::string kernel = "") {
        StepMatrix m;
        m.mat = {kind, g, chunks, std::move(kernel)};
        mats.push_back(std::move(m));
    };
    for (int i = 0; i < n_layer; ++i) {
        // (gpt-cuda binds GPT-2's fused attn_qkv where the file has it)
        if (!moe && v.find_tensor(blk(i, "attn_qkv.weight"))) {
            const Matrix qkv = matrix(v, blk(i, "attn_qkv.weight"));
            dense("attn_qkv", one(qkv, qkv.cols));
        } else {
            Matrix qkv[3];
            int rows[3];
            const char* names[3] = {"attn_q.weight", "attn_k.weight", "attn_v.weight"};
            for (int k = 0; k < 3; ++k) {
                qkv[k] = matrix(v, blk(i, names[k]));
                rows[k] = qkv[k].rows;
            }
            dense("attn_qkv", segments(qkv, rows, 3));
        }
        // (as the batched step's decode: the MoE layers' fused attention
        // leaves chunks where the head dim takes it)
        const Matrix out = matrix(v, blk(i, "attn_output.weight"));
        dense("attn_output", one(out, out.cols), moe && attention_head_dim_fast(head_dim) && takes_chunks(p, out.type));
        if (!moe) {
            const Matrix up = matrix(v, blk(i, "ffn_up.weight")), down = matrix(v, blk(i, "ffn_down.weight"));
            dense("ffn_up", one(up, up.cols));
            dense("ffn_down", one(down, down.cols));
            continue;
        }
        const Matrix router = matrix(v, blk(i, "ffn_gate_inp.weight"));
        ExpertLayer e;
        e.n_expert = count_key(v, "expert_count");
        e.k = count_key(v, "expert_used_count");
        e.n_embd = n_embd;
        e.router_type = router.type;
        if (v.find_tensor(blk(i, "ffn_gate_up_exps.weight"))) {  // each expert's gate rows, then its up rows
            const Matrix gu = experts(v, blk(i, "ffn_gate_up_exps.weight"), n_embd, e.n_expert);
            if (gu.rows % 2) bad(blk(i, "ffn_gate_up_exps.weight") + ": fused gate|up of odd rows");
            e.gate_type = e.up_type = gu.type;
            e.n_ff = gu.rows / 2;
        } else {
            const Matrix gate = experts(v, blk(i, "ffn_gate_exps.weight"), n_embd, e.n_expert);
            const Matrix up = experts(v, blk(i, "ffn_up_exps.weight"), n_embd, e.n_expert);
            if (up.rows != gate.rows) bad(blk(i, "ffn_up_exps.weight") + ": rows other than the gate's");
            e.gate_type = gate.type;
            e.up_type = up.type;
            e.n_ff = gate.rows;
        }
        const Matrix down = experts(v, blk(i, "ffn_down_exps.weight"), e.n_ff, e.n_expert);
        if (down.rows != n_embd) bad(blk(i, "ffn_down_exps.weight") + ": rows other than embedding_length");
        e.down_type = down.type;
        const ExpertForms f = o.forms ? o.forms(i, e) : expert_forms(p, e);
        // (one token, the experts' kernel taking it: the router's own
        // kernel where it takes the router, else the GEMV)
        dense("ffn_gate_inp (router)", one(router, router.cols), false,
              !f.decode || !f.router_kernel ? ""
              : p.moe_fused_route         ? "router_decode_kernel (a block per expert row, pre-norm inside): logits"
                                          : "router_decode_kernel (a block per expert row, pre-norm inside): logits, "
                                            "top-k in its last block");
        for (const bool gate_up : {true, false}) {
            StepMatrix m;
            m.mat.kind = gate_up ? "ffn_gate_up_exps" : "ffn_down_exps";
            m.experts = e;
            m.forms = f;
            m.gate_up = gate_up;
            mats.push_back(std::move(m));
        }
    }
    const Matrix head = v.find_tensor("output.weight") ? matrix(v, "output.weight") : matrix(v, "token_embd.weight");
    dense("output", one(head, head.cols));
    return mats;
}

}  // namespace ehcuda
