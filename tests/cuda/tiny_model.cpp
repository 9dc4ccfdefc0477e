#include "tiny_model.hpp"

#include <cmath>
#include <cstring>
#include <stdexcept>

#include <engine_host/tensor_types.h>

#include "host_reference.hpp"

namespace ehtest {

TinyModel::TinyModel(const TinySpec& spec) : s_(spec) {
    std::mt19937 rng(s_.seed);
    const int hd = head_dim();
    const std::string a = s_.arch;
    if (!s_.wtype) s_.wtype = EH_TYPE_F32;
    if (!s_.embd_type) s_.embd_type = s_.wtype;
    if (!s_.out_type) s_.out_type = s_.wtype;
    add_u32(a + ".embedding_length", s_.n_embd);
    add_u32(a + ".block_count", s_.n_layer);
    add_u32(a + ".attention.head_count", s_.n_head);
    add_u32(a + ".attention.head_count_kv", s_.n_kv);
    add_u32(a + ".feed_forward_length", s_.n_ff);
    add_u32(a + ".context_length", 4096);
    if (s_.n_rot) add_u32(a + ".rope.dimension_count", s_.n_rot);
    if (s_.window) add_u32(a + ".attention.sliding_window", s_.window);
    add_f32(a + ".rope.freq_base", s_.freq_base);
    add_f32(a + ".attention.layer_norm_rms_epsilon", s_.eps);

    auto ty = [&](const std::string& n, uint32_t d) {
        auto it = s_.overrides.find(n);
        return it == s_.overrides.end() ? d : it->second;
    };
    add_tensor("token_embd.weight", ty("token_embd.weight", s_.embd_type), s_.n_embd, s_.n_vocab, rng);
    add_tensor("output_norm.weight", EH_TYPE_F32, s_.n_embd, 1, rng, true);
    if (!s_.tied) add_tensor("output.weight", ty("output.weight", s_.out_type), s_.n_embd, s_.n_vocab, rng);
    for (int i = 0; i < s_.n_layer; ++i) {
        std::string p = "blk." + std::to_string(i) + ".";
        auto w = [&](const std::string& n, int cols, int rows) { add_tensor(p + n, ty(p + n, s_.wtype), cols, rows, rng); };
        add_tensor(p + "attn_norm.weight", EH_TYPE_F32, s_.n_embd, 1, rng, true);
        if (a == "phi3") {
            w("attn_qkv.weight", s_.n_embd, (s_.n_head + 2 * s_.n_kv) * hd);
        } else {
            w("attn_q.weight", s_.n_embd, s_.n_head * hd);
            w("attn_k.weight", s_.n_embd, s_.n_kv * hd);
            w("attn_v.weight", s_.n_embd, s_.n_kv * hd);
            if (a == "qwen2") {
                add_tensor(p + "attn_q.bias", EH_TYPE_F32, s_.n_head * hd, 1, rng, false, true);
                add_tensor(p + "attn_k.bias", EH_TYPE_F32, s_.n_kv * hd, 1, rng, false, true);
                add_tensor(p + "attn_v.bias", EH_TYPE_F32, s_.n_kv * hd, 1, rng, false, true);
            }
            if (a == "qwen3") {  // one RMSNorm weight over a head's dims, shared by every head
                add_tensor(p + "attn_q_norm.weight", EH_TYPE_F32, hd, 1, rng, true);
                add_tensor(p + "attn_k_norm.weight", EH_TYPE_F32, hd, 1, rng, true);
            }
        }
        w("attn_output.weight", s_.n_head * hd, s_.n_embd);
        add_tensor(p + "ffn_norm.weight", EH_TYPE_F32, s_.n_embd, 1, rng, true);
        if (a == "phi3") {
            w("ffn_up.weight", s_.n_embd, 2 * s_.n_ff);
        } else {
            w("ffn_gate.weight", s_.n_embd, s_.n_ff);
            w("ffn_up.weight", s_.n_embd, s_.n_ff);
        }
        w("ffn_down.weight", s_.n_ff, s_.n_embd);
    }
    finish();
}

void TinyModel::add_u32(const std::string& key, uint32_t v) {
    strings_.push_back(key);
    eh_metadata_kv kv{};
    kv.key = {strings_.back().c_str(), strings_.back().size()};
    kv.value.type = EH_VALUE_U32;
    kv.value.count = 1;
    kv.value.v.u64 = v;
    meta_.push_back(kv);
}

void TinyModel::add_f32(const std::string& key, float v) {
    strings_.push_back(key);
    eh_metadata_kv kv{};
    kv.key = {strings_.back().c_str(), strings_.back().size()};
    kv.value.type = EH_VALUE_F32;
    kv.value.count = 1;
    kv.value.v.f64 = v;
    meta_.push_back(kv);
}

void TinyModel::add_tensor(const std::string& name, uint32_t type, int cols, int rows, std::mt19937& rng,
                           bool is_norm, bool is_bias) {
    strings_.push_back(name);
    eh_tensor t{};
    t.name = {strings_.back().c_str(), strings_.back().size()};
    t.type = type;
    t.n_dims = rows == 1 ? 1 : 2;
    t.dims[0] = uint64_t(cols);
    t.dims[1] = uint64_t(rows);
    t.dims[2] = t.dims[3] = 1;
    std::vector<uint8_t> bytes;
    if (is_norm || is_bias) {
        std::normal_distribution<float> nd(0.0f, is_bias ? 0.2f : 0.1f);
        std::vector<float> v(static_cast<size_t>(cols));
        for (auto& x : v) x = (is_norm ? 1.0f : 0.0f) + nd(rng);
        bytes.resize(v.size() * 4);
        std::memcpy(bytes.data(), v.data(), bytes.size());
    } else if (!s_.no_data) {
        bytes = random_rows(type, rows, cols, rng, s_.magnitude);
    }
    t.nbytes = s_.no_data && !is_norm && !is_bias ? row_size(type, cols) * static_cast<size_t>(rows) : bytes.size();
    blobs_.push_back(std::move(bytes));
    t.data = blobs_.back().empty() ? reinterpret_cast<const void*>(uintptr_t(64)) : blobs_.back().data();
    tensors_.push_back(t);
    shapes_[name] = {rows, cols};
}

void TinyModel::add_fake_tensor(const std::string& name, uint32_t type, uint64_t d0, uint64_t d1) {
    strings_.push_back(name);
    eh_tensor t{};
    t.name = {strings_.back().c_str(), strings_.back().size()};
    t.type = type;
    t.n_dims = 2;
    t.dims[0] = d0;
    t.dims[1] = d1;
    t.dims[2] = t.dims[3] = 1;
    t.nbytes = row_size(type, int(d0)) * d1;
    t.data = reinterpret_cast<const void*>(uintptr_t(64));  // never read
    // Replace an existing tensor of that name.
    for (auto& x : tensors_)
        if (std::string(x.name.data, x.name.size) == name) {
            x = t;
            finish();
            return;
        }
    tensors_.push_back(t);
    finish();
}

void TinyModel::round_matrices(uint32_t type) {
    if (type != EH_TYPE_F16 && type != EH_TYPE_BF16) throw std::runtime_error("round_matrices: F16 or BF16 only");
    for (auto& t : tensors_) {
        if (t.type != EH_TYPE_F32 || t.n_dims < 2) continue;
        const size_t n = t.nbytes / 4;
        std::vector<uint8_t> bytes(n * 2);
        for (size_t i = 0; i < n; ++i) {
            float f;
            std::memcpy(&f, static_cast<const uint8_t*>(t.data) + 4 * i, 4);
            const uint16_t h = type == EH_TYPE_F16 ? f32_to_f16(f) : f32_to_bf16(f);
            std::memcpy(&bytes[2 * i], &h, 2);
        }
        blobs_.push_back(std::move(bytes));
        t.type = type;
        t.nbytes = n * 2;
        t.data = blobs_.back().data();
    }
    dequant_.clear();
    finish();
}

void TinyModel::finish() {
    strings_.push_back(s_.arch);
    view_.struct_size = sizeof(eh_model_view);
    view_.format = s_.safetensors ? EH_FORMAT_SAFETENSORS : EH_FORMAT_GGUF;
    view_.architecture = {strings_.back().c_str(), strings_.back().size()};
    view_.n_metadata = meta_.size();
    view_.metadata = meta_.data();
    view_.n_tensors = tensors_.size();
    view_.tensors = tensors_.data();
}

const std::vector<float>& TinyModel::deq(const std::string& name) const {
    auto it = dequant_.find(name);
    if (it != dequant_.end()) return it->second;
    for (const auto& t : tensors_) {
        if (std::string(t.name.data, t.name.size) != name) continue;
        const int cols = int(t.dims[0]), rows = t.n_dims > 1 ? int(t.dims[1]) : 1;
        std::vector<float> v(static_cast<size_t>(rows) * cols);
        const size_t rs = row_size(t.type, cols);
        for (int r = 0; r < rows; ++r)
            dequant_row(t.type, static_cast<const uint8_t*>(t.data) + rs * r, cols, v.data() + static_cast<size_t>(r) * cols);
        auto& self = const_cast<TinyModel&>(*this);
        return self.dequant_[name] = std::move(v);
    }
    throw std::runtime_error("no tensor " + name);
}

namespace {

void matvec(const std::vector<float>& W, int rows, int cols, const float* x, float* y) {
    for (int r = 0; r < rows; ++r) {
        double s = 0;
        const float* w = W.data() + static_cast<size_t>(r) * cols;
        for (int k = 0; k < cols; ++k) s += double(w[k]) * x[k];
        y[r] = float(s);
    }
}

void rmsnorm(const float* x, const std::vector<float>& w, int n, float eps, float* out) {
    double ss = 0;
    for (int i = 0; i < n; ++i) ss += double(x[i]) * x[i];
    float sc = float(1.0 / std::sqrt(ss / n + eps));
    for (int i = 0; i < n; ++i) out[i] = x[i] * sc * w[i];
}

void rope(float* v, int hd, int n_rot, int pos, float base, bool neox) {
    for (int i = 0; i < n_rot / 2; ++i) {
        double theta = pos * std::pow(double(base), -2.0 * i / n_rot);
        float c = float(std::cos(theta)), s = float(std::sin(theta));
        int a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
    (void)hd;
}

}  // namespace

std::vector<std::vector<float>> TinyModel::reference_logits(const std::vector<int32_t>& tokens) const {
    const int E = s_.n_embd, hd = head_dim(), H = s_.n_head, KV = s_.n_kv, F = s_.n_ff, V = s_.n_vocab;
    const int n_rot = s_.n_rot ? s_.n_rot : hd;
    const bool neox = s_.arch != "llama" || s_.safetensors;
    const int T = int(tokens.size());
    std::vector<std::vector<float>> kc(static_cast<size_t>(s_.n_layer)), vc(static_cast<size_t>(s_.n_layer));
    std::vector<std::vector<float>> out;
    const auto& emb = deq("token_embd.weight");
    const auto& outw = deq(s_.tied ? "token_embd.weight" : "output.weight");
    for (int t = 0; t < T; ++t) {
        std::vector<float> x(emb.begin() + static_cast<size_t>(tokens[static_cast<size_t>(t)]) * E, emb.begin() + static_cast<size_t>(tokens[static_cast<size_t>(t)] + 1) * E);
        std::vector<float> xn(static_cast<size_t>(E)), q(static_cast<size_t>(H * hd)), k(static_cast<size_t>(KV * hd)), v(static_cast<size_t>(KV * hd));
        for (int l = 0; l < s_.n_layer; ++l) {
            std::string p = "blk." + std::to_string(l) + ".";
            rmsnorm(x.data(), deq(p + "attn_norm.weight"), E, s_.eps, xn.data());
            if (s_.arch == "phi3") {
                std::vector<float> qkv(static_cast<size_t>((H + 2 * KV) * hd));
                matvec(deq(p + "attn_qkv.weight"), (H + 2 * KV) * hd, E, xn.data(), qkv.data());
                std::copy(qkv.begin(), qkv.begin() + H * hd, q.begin());
                std::copy(qkv.begin() + H * hd, qkv.begin() + (H + KV) * hd, k.begin());
                std::copy(qkv.begin() + (H + KV) * hd, qkv.end(), v.begin());
            } else {
                matvec(deq(p + "attn_q.weight"), H * hd, E, xn.data(), q.data());
                matvec(deq(p + "attn_k.weight"), KV * hd, E, xn.data(), k.data());
                matvec(deq(p + "attn_v.weight"), KV * hd, E, xn.data(), v.data());
                if (s_.arch == "qwen2") {
                    const auto &bq = deq(p + "attn_q.bias"), &bk = deq(p + "attn_k.bias"), &bv = deq(p + "attn_v.bias");
                    for (int i = 0; i < H * hd; ++i) q[static_cast<size_t>(i)] += bq[static_cast<size_t>(i)];
                    for (int i = 0; i < KV * hd; ++i) { k[static_cast<size_t>(i)] += bk[static_cast<size_t>(i)]; v[static_cast<size_t>(i)] += bv[static_cast<size_t>(i)]; }
                }
                if (s_.arch == "qwen3") {  // each head of q and k normalised before RoPE
                    const auto &nq = deq(p + "attn_q_norm.weight"), &nk = deq(p + "attn_k_norm.weight");
                    for (int h = 0; h < H; ++h) rmsnorm(q.data() + h * hd, nq, hd, s_.eps, q.data() + h * hd);
                    for (int h = 0; h < KV; ++h) rmsnorm(k.data() + h * hd, nk, hd, s_.eps, k.data() + h * hd);
                }
            }
            for (int h = 0; h < H; ++h) rope(q.data() + h * hd, hd, n_rot, t, s_.freq_base, neox);
            for (int h = 0; h < KV; ++h) rope(k.data() + h * hd, hd, n_rot, t, s_.freq_base, neox);
            kc[static_cast<size_t>(l)].insert(kc[static_cast<size_t>(l)].end(), k.begin(), k.end());
            vc[static_cast<size_t>(l)].insert(vc[static_cast<size_t>(l)].end(), v.begin(), v.end());
            std::vector<float> att(static_cast<size_t>(H * hd), 0.0f);
            const float scale = 1.0f / std::sqrt(float(hd));
            for (int h = 0; h < H; ++h) {
                const int g = h / (H / KV);
                const int k0 = s_.window > 0 ? std::max(0, t - s_.window + 1) : 0;
                std::vector<double> sc;
                double mx = -1e300;
                for (int j = k0; j <= t; ++j) {
                    double s = 0;
                    for (int d = 0; d < hd; ++d) s += double(q[static_cast<size_t>(h * hd + d)]) * kc[static_cast<size_t>(l)][static_cast<size_t>(j * KV * hd + g * hd + d)];
                    s *= scale;
                    sc.push_back(s);
                    mx = std::max(mx, s);
                }
                double z = 0;
                for (auto& s : sc) { s = std::exp(s - mx); z += s; }
                for (int j = k0; j <= t; ++j)
                    for (int d = 0; d < hd; ++d)
                        att[static_cast<size_t>(h * hd + d)] += float(sc[static_cast<size_t>(j - k0)] / z * vc[static_cast<size_t>(l)][static_cast<size_t>(j * KV * hd + g * hd + d)]);
            }
            std::vector<float> o(static_cast<size_t>(E));
            matvec(deq(p + "attn_output.weight"), E, H * hd, att.data(), o.data());
            for (int i = 0; i < E; ++i) x[static_cast<size_t>(i)] += o[static_cast<size_t>(i)];
            rmsnorm(x.data(), deq(p + "ffn_norm.weight"), E, s_.eps, xn.data());
            std::vector<float> gate(static_cast<size_t>(F)), up(static_cast<size_t>(F));
            if (s_.arch == "phi3") {
                std::vector<float> gu(static_cast<size_t>(2 * F));
                matvec(deq(p + "ffn_up.weight"), 2 * F, E, xn.data(), gu.data());
                std::copy(gu.begin(), gu.begin() + F, gate.begin());
                std::copy(gu.begin() + F, gu.end(), up.begin());
            } else {
                matvec(deq(p + "ffn_gate.weight"), F, E, xn.data(), gate.data());
                matvec(deq(p + "ffn_up.weight"), F, E, xn.data(), up.data());
            }
            for (int i = 0; i < F; ++i) gate[static_cast<size_t>(i)] = gate[static_cast<size_t>(i)] / (1.0f + std::exp(-gate[static_cast<size_t>(i)])) * up[static_cast<size_t>(i)];
            matvec(deq(p + "ffn_down.weight"), E, F, gate.data(), o.data());
            for (int i = 0; i < E; ++i) x[static_cast<size_t>(i)] += o[static_cast<size_t>(i)];
        }
        rmsnorm(x.data(), deq("output_norm.weight"), E, s_.eps, xn.data());
        std::vector<float> logits(static_cast<size_t>(V));
        matvec(outw, V, E, xn.data(), logits.data());
        out.push_back(std::move(logits));
    }
    return out;
}

}  // namespace ehtest
