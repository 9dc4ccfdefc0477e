// Header-only C++17 reader of a LoRA adapter view (ABI 1.6): llama.cpp's GGUF
// LoRA format, as its convert_lora_to_gguf.py writes it, checked against the
// base model it will adapt. The host uses it before adapter_load and a plugin
// may use it inside adapter_load, so both refuse a file with the same words.
//
// The format (facts of the public format, not of any implementation):
//   general.type          "adapter"
//   general.architecture  the base model's architecture
//   adapter.type          "lora"
//   adapter.lora.alpha    f32; absent or 0: the scale is the user's alone
//   tensors               "<W>.lora_a" {n_in, r} and "<W>.lora_b" {r, n_out}
//                         for a base weight W of dims {n_in, n_out}, in F32,
//                         F16, BF16 or Q8_0; "*_norm.weight" tensors some
//                         tools add are ignored.
// Effective scale of a pair: alpha > 0 ? scale * alpha / r : scale.
#ifndef ENGINE_HOST_LORA_ADAPTER_HPP
#define ENGINE_HOST_LORA_ADAPTER_HPP

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <engine_host/plugin_abi.h>
#include <engine_host/plugin_abi.hpp>

namespace ehp {

// Largest rank a pair may have: far above what fine-tuning uses (8-256);
// bounds the work one token costs.
constexpr uint64_t kMaxLoraRank = 1024;

struct LoraPair {
    std::string base;            // the base weight's name, e.g. "blk.0.attn_q.weight"
    const eh_tensor* a = nullptr;  // in the adapter view: {n_in, rank}
    const eh_tensor* b = nullptr;  // {rank, n_out}
    const eh_tensor* w = nullptr;  // in the base view: {n_in, n_out}
    uint64_t rank = 0, n_in = 0, n_out = 0;
};

struct LoraAdapterInfo {
    float alpha = 0.0f;
    std::vector<LoraPair> pairs;        // sorted by base name
    std::vector<std::string> ignored;   // norm tensors the format allows and nobody applies
    uint64_t max_rank = 0;
};

inline bool lora_type_ok(uint32_t t) {
    return t == EH_TYPE_F32 || t == EH_TYPE_F16 || t == EH_TYPE_BF16 || t == EH_TYPE_Q8_0;
}

// Reads `adapter` and checks it against `base`. Throws ehp::Error
// (EH_MODEL_LOAD_FAILED) naming the key or tensor at fault, or EH_UNSUPPORTED
// for what the format allows and engine-host does not serve (adapters of the
// token embeddings, of 3-D expert tensors, activated LoRA).
inline LoraAdapterInfo read_lora_adapter(const eh_model_view& adapter, const eh_model_view& base) {
    auto fail = [](const std::string& m) { throw Error(EH_MODEL_LOAD_FAILED, "LoRA adapter: " + m); };
    auto refuse = [](const std::string& m) { throw Error(EH_UNSUPPORTED, "LoRA adapter: " + m); };
    const ModelView av(&adapter), bv(&base);
    LoraAdapterInfo out;

    const auto type = av.get_string("general.type");
    if (!type || *type != "adapter")
        fail("general.type must be 'adapter' (got " + (type ? "'" + std::string(*type) + "'" : std::string("none")) +
             "): this is not an adapter file");
    const auto kind = av.get_string("adapter.type");
    if (!kind || *kind != "lora")
        fail("adapter.type must be 'lora' (got " + (kind ? "'" + std::string(*kind) + "'" : std::string("none")) + ")");
    if (av.architecture() != bv.architecture())
        fail("its architecture '" + std::string(av.architecture()) + "' is not the model's '" +
             std::string(bv.architecture()) + "' (general.architecture)");
    if (av.find("adapter.alora.invocation_tokens"))
        refuse("activated LoRA (adapter.alora.invocation_tokens) is not supported");
    if (const auto alpha = av.get_float("adapter.lora.alpha")) {
        if (!std::isfinite(*alpha) || *alpha < 0 || *alpha > 1e6)
            fail("adapter.lora.alpha must be a finite number in [0, 1e6]");
        out.alpha = static_cast<float>(*alpha);
    }

    struct Halves {
        const eh_tensor* a = nullptr;
        const eh_tensor* b = nullptr;
    };
    std::map<std::string, Halves> halves;
    auto ends_with = [](std::string_view s, std::string_view suffix) {
        return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
    };
    for (uint64_t i = 0; i < adapter.n_tensors; ++i) {
        const eh_tensor& t = adapter.tensors[i];
        const std::string_view name = to_sv(t.name);
        const bool is_a = ends_with(name, ".lora_a"), is_b = ends_with(name, ".lora_b");
        if (!is_a && !is_b) {
            if (ends_with(name, "_norm.weight")) {
                out.ignored.emplace_back(name);
                continue;
            }
            fail("tensor '" + std::string(name) + "' is neither a .lora_a nor a .lora_b tensor");
        }
        Halves& h = halves[std::string(name.substr(0, name.size() - 7))];
        (is_a ? h.a : h.b) = &t;
    }
    if (halves.empty()) fail("it has no .lora_a / .lora_b tensor pairs");

    for (const auto& [name, h] : halves) {
        if (!h.a || !h.b)
            fail("tensor '" + name + (h.a ? ".lora_b" : ".lora_a") + "' is missing (the pair of '" + name +
                 (h.a ? ".lora_a" : ".lora_b") + "')");
        if (name == "token_embd.weight")
            refuse("'token_embd.weight' (an adapter of the token embeddings) is not supported");
        const eh_tensor* w = bv.find_tensor(name);
        if (!w) fail("'" + name + "' is not a tensor of the model (an adapter for another model?)");
        if (w->n_dims != 2)
            refuse("'" + name + "' has " + std::to_string(w->n_dims) + " dimensions; only 2-D weights are adapted");
        for (const eh_tensor* t : {h.a, h.b}) {
            const std::string tn(to_sv(t->name));
            if (t->n_dims != 2) fail("tensor '" + tn + "' must have 2 dimensions, has " + std::to_string(t->n_dims));
            if (!lora_type_ok(t->type))
                fail("tensor '" + tn + "' is " + type_name(t->type) + "; adapters are F32, F16, BF16 or Q8_0");
        }
        LoraPair p;
        p.base = name;
        p.a = h.a;
        p.b = h.b;
        p.w = w;
        p.n_in = w->dims[0];
        p.n_out = w->dims[1];
        p.rank = h.a->dims[1];
        if (h.a->dims[0] != p.n_in || h.b->dims[1] != p.n_out)
            fail("'" + name + "': lora_a is {" + std::to_string(h.a->dims[0]) + ", " + std::to_string(h.a->dims[1]) +
                 "} and lora_b {" + std::to_string(h.b->dims[0]) + ", " + std::to_string(h.b->dims[1]) +
                 "}; the model's weight is {" + std::to_string(p.n_in) + ", " + std::to_string(p.n_out) +
                 "}, so they must be {" + std::to_string(p.n_in) + ", r} and {r, " + std::to_string(p.n_out) + "}");
        if (h.b->dims[0] != p.rank)
            fail("'" + name + "': the ranks disagree (lora_a has " + std::to_string(p.rank) + ", lora_b " +
                 std::to_string(h.b->dims[0]) + ")");
        if (p.rank == 0 || p.rank > kMaxLoraRank)
            fail("'" + name + "': rank " + std::to_string(p.rank) + " is outside 1.." + std::to_string(kMaxLoraRank));
        if (p.rank > out.max_rank) out.max_rank = p.rank;
        out.pairs.push_back(std::move(p));
    }
    return out;
}

}  // namespace ehp

#endif  // ENGINE_HOST_LORA_ADAPTER_HPP
