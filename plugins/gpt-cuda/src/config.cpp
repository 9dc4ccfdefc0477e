#include "config.hpp"

#include <algorithm>
#include <cmath>

#include <engine_host/model_source.hpp>
#include <ehcuda/arch_metadata.hpp>
#include <ehcuda/moe.hpp>

namespace gpt_cuda {
std::vector<float> rope_inv_freq(const RopeParams& p, float* attn_factor) {
    const int half = p.n_rot / 2;
    const double dim = p.n_rot, base = p.freq_base;
    std::vector<float> f(static_cast<size_t>(half));
    *attn_factor = 1.0f;
    // Pairs that turn fewer than beta_slow times over the original context
    // are interpolated (divided by factor), more than beta_fast times kept,
    // a linear ramp in between (HF's YaRN parameters).
    double low = 0, high = 0;
    const bool yarn = p.yarn && p.factor > 1.0;
    if (yarn) {
        auto corr = [&](double rotations) { return dim * std::log(p.orig_ctx / (rotations * 2.0 * M_PI)) / (2.0 * std::log(base)); };
        low = corr(p.beta_fast);
        high = corr(p.beta_slow);
        if (p.truncate) {
            low = std::floor(low);
            high = std::ceil(high);
        }
        low = std::max(low, 0.0);
        high = std::min(high, dim - 1);
        if (low == high) high += 0.001;
        *attn_factor = float(0.1 * std::log(p.factor) + 1.0);
    }
    for (int i = 0; i < half; ++i) {
        const double orig = 1.0 / std::pow(base, 2.0 * i / dim);
        if (!yarn) {
            f[size_t(i)] = float(orig);
            continue;
        }
        const double keep = 1.0 - std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
        f[size_t(i)] = float(orig / p.factor * (1.0 - keep) + orig * keep);
    }
    return f;
}

Config read_config(const ehp::ModelView& view) {
    Config c;
    c.arch_name = std::string(view.architecture());
    if (c.arch_name == "gpt2") c.arch = Arch::Gpt2;
    else if (c.arch_name == "gpt-oss") c.arch = Arch::GptOss;
    else if (c.arch_name == "qwen3moe") c.arch = Arch::Qwen3Moe;
    else throw ehp::Error(EH_UNSUPPORTED, "gpt-cuda does not serve architecture '" + c.arch_name + "' (gpt2, gpt-oss, qwen3moe)");
    // An HF Qwen3-MoE checkpoint keeps its experts one tensor each (the host
    // names them blk.N.ffn_gate.E.weight) or fused; this loader reads the
    // GGUF's stacked experts only, which `engine-host convert` writes from
    // either (cpu-reference serves the directory as it is).
    if (c.arch == Arch::Qwen3Moe && ehp::from_safetensors(view))
        throw ehp::Error(EH_UNSUPPORTED, "qwen3moe from a Hugging Face directory is not supported by gpt-cuda (convert it "
                                         "to GGUF: engine-host convert --hf DIR --out FILE)");
    auto key = [&](const char* s) { return view.arch_key(s); };
    auto req = [&](const char* s) { return ehcuda::arch_int(view, s); };
    auto opt = [&](const char* s, int dflt) { return ehcuda::arch_int_or(view, s, dflt); };
    auto num = [&](const char* s, double dflt) { return view.get_float(key(s)).value_or(dflt); };
    auto bad = [&](const std::string& why) { throw ehp::Error(EH_MODEL_LOAD_FAILED, c.arch_name + ": " + why); };

    c.n_embd = req("embedding_length");
    c.n_layer = req("block_count");
    c.n_head = req("attention.head_count");
    c.n_kv = opt("attention.head_count_kv", c.n_head);
    if (c.n_kv > c.n_head || c.n_head % c.n_kv)
        bad("head_count " + std::to_string(c.n_head) + " is not a multiple of head_count_kv " + std::to_string(c.n_kv));
    c.head_dim = opt("attention.key_length", c.n_embd / c.n_head);
    if (opt("attention.value_length", c.head_dim) != c.head_dim) throw ehp::Error(EH_UNSUPPORTED, "gpt-cuda: key_length != value_length");
    if (c.head_dim <= 0 || c.head_dim > 256)
        throw ehp::Error(EH_UNSUPPORTED, "gpt-cuda: head dimension " + std::to_string(c.head_dim) + " not supported (1..256)");
    c.n_ctx_train = opt("context_length", 0);
    if (c.n_embd % 32) bad("embedding_length must be a multiple of 32");

    if (c.arch == Arch::Gpt2) {
        c.eps = float(num("attention.layer_norm_epsilon", 1e-5));
        c.n_ff = req("feed_forward_length");
        if (c.n_ff % 32) bad("feed_forward_length must be a multiple of 32");
        return c;
    }

    c.eps = float(num("attention.layer_norm_rms_epsilon", 1e-5));
    c.n_expert = req("expert_count");
    c.n_expert_used = req("expert_used_count");
    c.n_ff_exp = opt("expert_feed_forward_length", opt("feed_forward_length", 0));
    if (c.n_expert_used > c.n_expert || c.n_ff_exp == 0) bad("expert_used_count / expert_feed_forward_length invalid");
    if (c.n_expert_used > 32) throw ehp::Error(EH_UNSUPPORTED, "gpt-cuda: at most 32 experts per token");
    if (c.n_expert > 1024) throw ehp::Error(EH_UNSUPPORTED, "gpt-cuda: at most 1024 experts (expert_count)");
    if (c.n_ff_exp % 32 || (c.q_dim() % 32)) bad("expert_feed_forward_length and head_count*key_length must be multiples of 32");
    if (c.arch == Arch::GptOss) {
        c.sliding_window = opt("attention.sliding_window", 0);
    } else {  // qwen3moe: full attention in every layer, norm_topk_prob routing (moe_route's softmax over the k)
        if (view.get_uint(key("attention.sliding_window")).value_or(0) > 0)
            throw ehp::Error(EH_UNSUPPORTED, "gpt-cuda: " + key("attention.sliding_window") + " is not supported for qwen3moe");
        c.qk_norm = true;
        c.swiglu_alpha = ehcuda::kPlainSwiGlu;
    }

    RopeParams rp;
    rp.n_rot = opt("rope.dimension_count", c.head_dim);
    if (rp.n_rot > c.head_dim || rp.n_rot % 2) bad("rope.dimension_count must be even and <= head dim");
    rp.freq_base = num("rope.freq_base", 10000.0);
    std::string scaling = "none";
    if (auto s = view.get_string(key("rope.scaling.type"))) scaling = std::string(*s);
    if (scaling == "yarn") {
        rp.yarn = true;
        rp.factor = num("rope.scaling.factor", 1.0);
        rp.orig_ctx = double(opt("rope.scaling.original_context_length", c.n_ctx_train));
        if (rp.orig_ctx <= 0) rp.orig_ctx = 4096;
        rp.beta_fast = num("rope.scaling.yarn_beta_fast", 32.0);
        rp.beta_slow = num("rope.scaling.yarn_beta_slow", 1.0);
        // gpt-oss's HF config turns off the rounding of the correction range
        // (HF's default rounds it)
        rp.truncate = c.arch != Arch::GptOss;
        for (const char* k : {"hf.rope_scaling.truncate", "hf.rope_parameters.truncate"})
            if (const eh_value* t = view.find(k); t && t->type == EH_VALUE_BOOL) rp.truncate = t->v.u64 != 0;
    } else if (scaling != "none") {
        throw ehp::Error(EH_UNSUPPORTED, key("rope.scaling.type") + " '" + scaling + "' is not supported by gpt-cuda (none, yarn)");
    }
    if (!(rp.freq_base > 0)) bad("rope.freq_base must be positive");
    c.n_rot = rp.n_rot;
    c.inv_freq = rope_inv_freq(rp, &c.attn_factor);
    return c;
}

}  // namespace gpt_cuda
