#include "convert_plan.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <engine_host/quant_blocks.hpp>
#include <engine_host/tensor_types.h>

#include "eh/error.hpp"
#include "eh/model/hf_names.hpp"
#include "eh/tools/recipe.hpp"
#include "row_stream.hpp"

namespace eh::tools {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

[[noreturn]] void bad(const std::string& hf, const std::string& what) {
    throw Error(Code::ModelLoadFailed, fmt::format("tensor '{}': {}", hf, what));
}

std::string shape_str(const std::vector<uint64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// Sort key: embeddings, blocks in layer order, output; inside a block the
// order llama.cpp's converter uses, weights before biases.
std::tuple<int, int, int, int, std::string> order_key(const std::string& g) {
    static constexpr std::string_view kRank[] = {
        "attn_norm", "attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "attn_sinks",
        "ffn_norm", "post_attention_norm", "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps",
        "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm"};
    const int bias = ends_with(g, ".bias") ? 1 : 0;
    if (g.rfind("token_embd.", 0) == 0) return {0, 0, 0, bias, g};
    if (g.rfind("position_embd.", 0) == 0) return {1, 0, 0, bias, g};
    if (g.rfind("output_norm.", 0) == 0) return {3, 0, 0, bias, g};
    if (g.rfind("output.", 0) == 0) return {4, 0, 0, bias, g};
    const int layer = layer_of(g);
    if (layer < 0) return {5, 0, 0, bias, g};
    const std::string_view rest = std::string_view(g).substr(g.find('.', 4) + 1);
    const std::string_view base = rest.substr(0, rest.find('.'));
    int rank = static_cast<int>(std::size(kRank));
    for (size_t i = 0; i < std::size(kRank); ++i)
        if (base == kRank[i]) rank = static_cast<int>(i);
    return {2, layer, rank, bias, g};
}

// gpt-oss expert tensors, named by the host's reader
// "blk.N.ffn_{gate_up,down}_exps.{weight,bias,blocks,scales}".
void plan_expert(std::vector<Planned>& plan, const std::string& g, const std::string& hf, const SafeTensor& t,
                 const std::map<std::string, SafeTensor>& st) {
    const std::string blk = g.substr(0, g.find("ffn_"));
    const bool gate_up = g.find("ffn_gate_up_exps.") != std::string::npos;
    // `dim`: the ggml dim that holds the fused rows (1 for weights, 0 for biases)
    auto split = [&](Planned p, const std::string& suffix, size_t dim, uint64_t rows) {
        if (!gate_up) {
            p.gguf = blk + "ffn_down_exps" + suffix;
            plan.push_back(std::move(p));
            return;
        }
        p.dims[dim] = rows;
        p.step = 2;
        p.gguf = blk + "ffn_gate_exps" + suffix;
        plan.push_back(p);
        p.offset = 1;
        p.gguf = blk + "ffn_up_exps" + suffix;
        plan.push_back(std::move(p));
    };
    const auto& s = t.shape;
    if (ends_with(g, ".scales")) return;  // planned with its blocks
    if (ends_with(g, ".blocks")) {
        std::string sn = hf;
        sn.replace(sn.size() - std::string_view("_blocks").size(), std::string_view("_blocks").size(), "_scales");
        auto it = st.find(sn);
        if (it == st.end()) bad(hf, fmt::format("MXFP4 blocks without their scales '{}'", sn));
        const auto& ss = it->second.shape;
        if (t.dtype != "U8" || it->second.dtype != "U8") bad(hf, "MXFP4 blocks and scales must be U8");
        if (s.size() != 4 || s[3] != 16) bad(hf, fmt::format("MXFP4 blocks have shape {}, expected [experts, rows, blocks, 16]", shape_str(s)));
        if (ss.size() != 3 || ss[0] != s[0] || ss[1] != s[1] || ss[2] != s[2])
            bad(sn, fmt::format("scales shape {} does not match blocks {}", shape_str(ss), shape_str(s)));
        if (gate_up && s[1] % 2) bad(hf, "fused gate_up has an odd row count");
        Planned p;
        p.hf = hf;
        p.hf_scales = sn;
        p.op = Op::Mxfp4;
        p.dims = {s[2] * 32, s[1], s[0]};
        split(std::move(p), ".weight", 1, s[1] / 2);
        return;
    }
    if (ends_with(g, ".weight")) {  // dense [experts, in, out]
        if (s.size() != 3) bad(hf, fmt::format("dense experts have shape {}, expected [experts, in, out]", shape_str(s)));
        if (gate_up && s[2] % 2) bad(hf, "fused gate_up has an odd column count");
        Planned p;
        p.hf = hf;
        p.op = Op::Experts;
        p.dims = {s[1], s[2], s[0]};
        split(std::move(p), ".weight", 1, s[2] / 2);
        return;
    }
    if (ends_with(g, ".bias")) {  // [experts, out]
        if (s.size() != 2) bad(hf, fmt::format("expert bias has shape {}, expected [experts, out]", shape_str(s)));
        if (gate_up && s[1] % 2) bad(hf, "fused gate_up bias has an odd length");
        Planned p;
        p.hf = hf;
        p.op = gate_up ? Op::Strided : Op::Copy;
        p.dims = {s[1], s[0]};
        if (gate_up) {
            split(std::move(p), ".bias", 0, s[1] / 2);
        } else {
            p.gguf = blk + "ffn_down_exps.bias";
            plan.push_back(std::move(p));
        }
        return;
    }
    bad(hf, "unrecognised expert tensor");
}

// Qwen3-MoE experts as the host's reader names them: one tensor per expert,
// "blk.N.ffn_{gate,up,down}.E.weight" ([rows, in] each), gathered here into
// `split`; or fused, "blk.N.ffn_gate_up_exps.weight" [X, 2F, H] (gate rows
// first) and "blk.N.ffn_down_exps.weight" [X, H, F]. Returns false for any
// other tensor.
using ExpertSplit = std::map<std::string, std::map<uint64_t, std::string>>;  // stacked name -> expert -> HF name
bool plan_qwen3moe_expert(std::vector<Planned>& plan, ExpertSplit& split, const std::string& g, const std::string& hf,
                          const SafeTensor& t, uint32_t n_expert) {
    const int layer = layer_of(g);
    if (layer < 0) return false;
    const std::string blk = g.substr(0, g.find('.', 4) + 1);
    const std::string_view rest = std::string_view(g).substr(blk.size());
    for (const char* which : {"ffn_gate.", "ffn_up.", "ffn_down."}) {
        const std::string_view w(which);
        if (rest.substr(0, w.size()) != w || !ends_with(rest, ".weight")) continue;
        // "ffn_up.weight" (a dense FFN) has no expert number
        const std::string_view num = rest.substr(w.size(), rest.size() - w.size() - 7);
        if (num.empty() || num.size() > 6 || !std::all_of(num.begin(), num.end(), [](char c) { return c >= '0' && c <= '9'; }))
            continue;
        const uint64_t e = std::stoull(std::string(num));
        if (e >= n_expert) bad(hf, fmt::format("expert {} of a model with {} experts (num_experts)", e, n_expert));
        split[blk + std::string(w.substr(0, w.size() - 1)) + "_exps.weight"][e] = hf;
        return true;
    }
    const bool gate_up = rest == "ffn_gate_up_exps.weight", down = rest == "ffn_down_exps.weight";
    if (!gate_up && !down) return false;
    const auto& s = t.shape;
    if (s.size() != 3 || s[0] != n_expert)
        bad(hf, fmt::format("fused experts have shape {}, expected [{} experts, rows, in]", shape_str(s), n_expert));
    if (gate_up && s[1] % 2) bad(hf, "fused gate_up has an odd row count");
    Planned p;
    p.hf = hf;
    p.op = Op::ExpertRows;
    p.dims = {s[2], gate_up ? s[1] / 2 : s[1], s[0]};
    if (down) {
        p.gguf = blk + "ffn_down_exps.weight";
        plan.push_back(std::move(p));
        return true;
    }
    p.gguf = blk + "ffn_gate_exps.weight";
    plan.push_back(p);
    p.gguf = blk + "ffn_up_exps.weight";
    p.offset = s[1] / 2;
    plan.push_back(std::move(p));
    return true;
}

// One stacked expert matrix from its per-expert tensors: every expert
// present, all of one shape and dtype.
Planned stack_experts(const std::string& gguf, const std::map<uint64_t, std::string>& experts, uint32_t n_expert,
                      const std::map<std::string, SafeTensor>& st) {
    Planned p;
    p.gguf = gguf;
    p.op = Op::ExpertRows;
    const SafeTensor& first = st.at(experts.begin()->second);
    for (uint64_t e = 0; e < n_expert; ++e) {
        auto it = experts.find(e);
        if (it == experts.end())
            throw Error(Code::ModelLoadFailed, fmt::format("'{}': expert {} of {} has no tensor", gguf, e, n_expert));
        const SafeTensor& t = st.at(it->second);
        if (t.shape.size() != 2) bad(it->second, fmt::format("has shape {}, expected [rows, in]", shape_str(t.shape)));
        if (t.shape != first.shape || t.dtype != first.dtype)
            bad(it->second, fmt::format("is {} {}, expert 0 is {} {}: the experts of a matrix must match", t.dtype,
                                        shape_str(t.shape), first.dtype, shape_str(first.shape)));
        p.hf_experts.push_back(it->second);
    }
    p.hf = p.hf_experts.front();
    const auto& s = st.at(p.hf).shape;
    p.dims = {s[1], s[0], n_expert};
    return p;
}

bool is_conv1d(const std::string& g) {
    for (const char* s : {".attn_qkv.weight", ".attn_output.weight", ".ffn_up.weight", ".ffn_down.weight"})
        if (ends_with(g, s)) return true;
    return false;
}

}  // namespace

std::vector<Planned> plan_tensors(const PlanInput& in, const std::map<std::string, SafeTensor>& st) {
    std::vector<Planned> plan;
    ExpertSplit split;
    for (const auto& [hf, t] : st) {
        const std::string g = model::hf_tensor_name_to_gguf(in.arch, hf);
        if (g.rfind("hf.", 0) == 0) {
            // buffers with no GGUF equivalent (GPT-2's attn.bias mask, rotary inv_freq)
            if (in.log) in.log(fmt::format("skipped '{}' (no GGUF equivalent)", hf));
            continue;
        }
        if (in.arch == "gpt-oss" && g.find("_exps.") != std::string::npos) {
            plan_expert(plan, g, hf, t, st);
            continue;
        }
        if (in.arch == "qwen3moe" && plan_qwen3moe_expert(plan, split, g, hf, t, in.n_expert)) continue;
        if (g == "output.weight" && in.tied && in.arch != "gpt2") continue;
        if (t.shape.empty() || t.shape.size() > 2)
            bad(hf, fmt::format("has {} dims (1 or 2 expected)", t.shape.size()));
        Planned p;
        p.gguf = g;
        p.hf = hf;
        p.dims.assign(t.shape.rbegin(), t.shape.rend());
        if (in.arch == "gpt2" && is_conv1d(g)) {
            if (p.dims.size() != 2) bad(hf, "a Conv1D weight must be 2-D");
            p.op = Op::Transpose;
            std::swap(p.dims[0], p.dims[1]);
        } else if (in.arch == "gemma3" && ends_with(g, "norm.weight")) {
            p.op = Op::AddOne;
        } else if (in.arch == "llama" && (ends_with(g, ".attn_q.weight") || ends_with(g, ".attn_k.weight"))) {
            p.op = Op::PermuteHeads;
            p.heads = ends_with(g, ".attn_q.weight") ? in.n_head : in.n_head_kv;
            if (p.dims.size() != 2 || p.dims[1] % (2 * uint64_t(p.heads)) != 0)
                bad(hf, fmt::format("rows do not split into {} heads of even size", p.heads));
        }
        plan.push_back(std::move(p));
    }
    for (const auto& [gguf, experts] : split) plan.push_back(stack_experts(gguf, experts, in.n_expert, st));
    if (in.arch == "qwen3moe")  // every layer sparse: a dense one is not this layout
        for (uint32_t l = 0; l < in.n_layer; ++l)
            for (const char* m : {"gate", "up", "down"}) {
                const std::string want = fmt::format("blk.{}.ffn_{}_exps.weight", l, m);
                if (std::none_of(plan.begin(), plan.end(), [&](const Planned& p) { return p.gguf == want; }))
                    throw Error(Code::ModelLoadFailed, fmt::format("qwen3moe: layer {} has no '{}' (its experts: "
                                                                   "mlp.experts.E.{}_proj.weight or mlp.experts.*)",
                                                                   l, want, m));
            }
    // GPT-2's converter writes the tied head out as output.weight.
    if (in.arch == "gpt2" && std::none_of(plan.begin(), plan.end(), [](const Planned& p) { return p.gguf == "output.weight"; })) {
        for (const Planned& p : plan)
            if (p.gguf == "token_embd.weight") {
                Planned o = p;
                o.gguf = "output.weight";
                plan.push_back(std::move(o));
                break;
            }
    }
    std::sort(plan.begin(), plan.end(), [](const Planned& a, const Planned& b) { return order_key(a.gguf) < order_key(b.gguf); });
    for (size_t i = 1; i < plan.size(); ++i)
        if (plan[i].gguf == plan[i - 1].gguf)
            throw Error(Code::ModelLoadFailed, fmt::format("tensors '{}' and '{}' both map to '{}'", plan[i - 1].hf, plan[i].hf, plan[i].gguf));
    return plan;
}

namespace {

// HF MXFP4 packs element 2i in the low and 2i+1 in the high nibble of byte
// i; a ggml block holds element j low and j+16 high in byte j, after its
// E8M0 scale byte.
void repack_mxfp4_block(const uint8_t* hf16, uint8_t scale, uint8_t* out17) {
    auto nib = [&](int k) { const uint8_t b = hf16[k >> 1]; return static_cast<uint8_t>((k & 1) ? b >> 4 : b & 0x0F); };
    out17[0] = scale;
    for (int j = 0; j < 16; ++j) out17[1 + j] = static_cast<uint8_t>(nib(j) | (nib(j + 16) << 4));
}

void write_mxfp4(const Planned& p, const std::map<std::string, SafeTensor>& st, model::ByteSink& sink) {
    const SafeTensor& bt = st.at(p.hf);
    const SafeTensor& stt = st.at(p.hf_scales);
    const std::vector<uint8_t> blocks = read_bytes(bt), scales = read_bytes(stt);
    const uint64_t nb = p.dims[0] / 32, rows = p.dims[1], n_expert = p.dims[2], phys = bt.shape[1];
    std::vector<uint8_t> out(rows * nb * 17);
    for (uint64_t e = 0; e < n_expert; ++e) {
        for (uint64_t r = 0; r < rows; ++r) {
            const uint64_t pr = e * phys + r * p.step + p.offset;
            for (uint64_t b = 0; b < nb; ++b)
                repack_mxfp4_block(blocks.data() + (pr * nb + b) * 16, scales[pr * nb + b], out.data() + (r * nb + b) * 17);
        }
        sink.write(out.data(), out.size());
    }
}

// Expert by expert, so that only one expert's floats are held at a time.
void write_expert_rows(const Planned& p, const std::map<std::string, SafeTensor>& st, uint32_t type, WorkerPool& pool,
                       model::ByteSink& sink) {
    const uint64_t ne0 = p.dims[0], rows = p.dims[1], n_expert = p.dims[2];
    for (uint64_t e = 0; e < n_expert; ++e) {
        std::vector<float> v;
        if (!p.hf_experts.empty()) {
            v = read_floats(st.at(p.hf_experts[e]));
        } else {
            const SafeTensor& t = st.at(p.hf);
            v = read_floats(t, (e * t.shape[1] + p.offset) * ne0, rows * ne0);
        }
        detail::stream_rows(p.gguf, type, ne0, rows, pool, sink, [&](uint64_t first, uint64_t n, float* out) {
            std::copy_n(v.begin() + first * ne0, n * ne0, out);
        });
    }
}

}  // namespace

void write_planned(const Planned& p, const std::map<std::string, SafeTensor>& st, uint32_t type, WorkerPool& pool,
                   model::ByteSink& sink) {
    if (p.op == Op::ExpertRows) {
        write_expert_rows(p, st, type, pool, sink);
        return;
    }
    if (p.op == Op::Mxfp4) {
        if (type != EH_TYPE_MXFP4) bad(p.hf, "MXFP4 experts can only be copied as MXFP4");
        write_mxfp4(p, st, sink);
        return;
    }
    const SafeTensor& t = st.at(p.hf);
    const std::vector<float> v = read_floats(t);
    const uint64_t ne0 = p.dims[0];
    uint64_t rows = 1;
    for (size_t i = 1; i < p.dims.size(); ++i) rows *= p.dims[i];
    detail::RowFill fill;
    switch (p.op) {
    case Op::Copy:
        fill = [&](uint64_t first, uint64_t n, float* out) { std::copy_n(v.begin() + first * ne0, n * ne0, out); };
        break;
    case Op::AddOne:
        fill = [&](uint64_t first, uint64_t n, float* out) {
            for (uint64_t i = 0; i < n * ne0; ++i) out[i] = v[first * ne0 + i] + 1.0f;
        };
        break;
    case Op::Transpose:  // source [ne0][rows]
        fill = [&](uint64_t first, uint64_t n, float* out) {
            for (uint64_t r = 0; r < n; ++r)
                for (uint64_t c = 0; c < ne0; ++c) out[r * ne0 + c] = v[c * rows + first + r];
        };
        break;
    case Op::PermuteHeads:  // new row h*hd + 2j + s <- old row h*hd + s*hd/2 + j
        fill = [&](uint64_t first, uint64_t n, float* out) {
            const uint64_t hd = rows / p.heads, half = hd / 2;
            for (uint64_t r = 0; r < n; ++r) {
                const uint64_t dst = first + r, h = dst / hd, w = dst % hd;
                const uint64_t src = h * hd + (w % 2) * half + w / 2;
                std::copy_n(v.begin() + src * ne0, ne0, out + r * ne0);
            }
        };
        break;
    case Op::Experts: {  // source [X][ne0][phys]
        const uint64_t per = p.dims[1], phys = t.shape[2];
        fill = [&, per, phys](uint64_t first, uint64_t n, float* out) {
            for (uint64_t r = 0; r < n; ++r) {
                const uint64_t g = first + r, e = g / per, col = (g % per) * p.step + p.offset;
                for (uint64_t k = 0; k < ne0; ++k) out[r * ne0 + k] = v[(e * ne0 + k) * phys + col];
            }
        };
        break;
    }
    case Op::Strided: {  // source [X][phys]
        const uint64_t phys = t.shape[1];
        fill = [&, phys](uint64_t first, uint64_t n, float* out) {
            for (uint64_t r = 0; r < n; ++r)
                for (uint64_t k = 0; k < ne0; ++k) out[r * ne0 + k] = v[(first + r) * phys + k * p.step + p.offset];
        };
        break;
    }
    case Op::Mxfp4:
    case Op::ExpertRows: break;
    }
    detail::stream_rows(p.gguf, type, ne0, rows, pool, sink, fill);
}

}  // namespace eh::tools
