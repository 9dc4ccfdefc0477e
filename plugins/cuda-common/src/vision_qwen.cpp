#include "ehcuda/vision_qwen.hpp"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <engine_host/mmproj.hpp>
#include <engine_host/plugin_abi.hpp>

#include "ehcuda/check.hpp"
#include "vision_ops.hpp"
#include "vision_qwen_layout.hpp"
#include "vision_qwen_ops.hpp"
#include "vision_tower.hpp"

namespace ehcuda {

using ehp::Error;
using namespace ehp::mmproj;
using vision::device_floats;
using vision::input_of;
using vision::Mat;
using vision::upload;
using vision::upload_mat;

struct QwenVlVision::Impl {
    struct Block {
        DeviceBuffer ln1, ln2;
        Mat qkv, o, gate_up, down;  // qkv: attn_q, attn_k, attn_v stacked; gate_up: ffn_gate, ffn_up
        DeviceBuffer qkv_b, o_b, gate_up_b, down_b;
    };
    MemoryLedger* ledger = nullptr;
    eh_image_encoder_info info{};
    uint32_t patch = 0, merge = 2, window = 0, width = 0, ff = 0, n_head = 0, wa_pattern = 0, text = 0;
    float eps = 1e-6f;
    Mat patch_w;  // [width][3 * patch * patch]: the two frames' kernels added (F32)
    std::vector<Block> blocks;
    DeviceBuffer post_ln, mm0_b, mm2_b;
    Mat mm0, mm2;
    bool half_attn = false, flash = false;
    int heads_per_group = 1;
    // Scratch for the largest image, and the host side of one image's layout.
    DeviceBuffer pixels, patches, x, h, qkv, att, tmp, u, g, qkvh, xh, scores, ph, mid, rows;
    DeviceBuffer rc, win, seg, cs, sn;
    std::vector<int32_t> h_rc, h_win, h_seg, h_unit;
    std::vector<float> h_cs, h_sn, h_rows;
    cudaEvent_t t0 = nullptr, t1 = nullptr;
    float ms = 0.0f;
    std::optional<vision::Gemms> gemms;  // last: created once the weights are up, gone before the buffers

    ~Impl() {
        if (t0) cudaEventDestroy(t0);
        if (t1) cudaEventDestroy(t1);
    }

    // A linear layer of a block: weight {cols, rows} (and the names for the
    // stacked ones), its biases concatenated.
    Mat block_mat(const ehp::ModelView& v, uint32_t i, std::initializer_list<const char*> whats, uint64_t cols,
                  uint64_t rows, DeviceBuffer& bias) {
        std::vector<const eh_tensor*> parts;
        std::vector<std::string> names;
        std::vector<float> b;
        for (const char* w : whats) {
            names.push_back(vblk(i, (std::string(w) + ".weight").c_str()));
            parts.push_back(&matrix(v, names.back(), cols, rows));
            const std::vector<float> bi = floats(v, vblk(i, (std::string(w) + ".bias").c_str()), rows);
            b.insert(b.end(), bi.begin(), bi.end());
        }
        bias = upload(b.data(), b.size(), ledger);
        return upload_mat(parts, names, int(rows), int(cols), ledger);
    }

    // att[N][width] from the rotated qkv rows: each head within its
    // window's rows (`full`: over every patch).
    void attention(int N, bool full, int n_win, int max_win) {
        const int W = int(width), hd = int(width / n_head);
        const float scale = 1.0f / std::sqrt(float(hd));
        cudaStream_t s = gemms->stream();
        if (flash) {
            if (full) vision::flash_attention(qkvh.as<__half>(), N, W, int(n_head), scale, att.as<float>(), s);
            else
                vision::flash_attention_segments(qkvh.as<__half>(), seg.as<int32_t>(), n_win, max_win, W, int(n_head),
                                                 scale, att.as<float>(), s);
            return;
        }
        // (heads whose scores the buffer holds: sized at load for the largest image)
        const int per = int(std::clamp<size_t>(scores.size() / (size_t(N) * N * 4), 1, n_head));
        const vision::GemmAttention a{half_attn ? qkvh.get() : qkv.get(), half_attn, N, W, int(n_head), per, scale,
                                      scores.as<float>(), ph.as<__half>(), att.as<float>()};
        const int32_t* w = full ? nullptr : win.as<int32_t>();
        gemms->attention(a, [&](int hg, float* outf, __half* outh) {
            vision::qwen::window_softmax(scores.as<float>(), hg, N, w, outf, outh, s);
        });
    }
};

QwenVlVision::QwenVlVision(const eh_model_view* view, uint32_t text_n_embd, MemoryLedger* ledger)
    : impl_(std::make_unique<Impl>()) {
    Impl& I = *impl_;
    I.ledger = ledger;
    I.text = text_n_embd;
    const ehp::ModelView v(view);
    vision::require_projector(v, "qwen2.5vl_merger", "is not Qwen2.5-VL's (qwen2.5vl_merger)");
    // The keys as cpu-reference's QwenVlEncoder reads and checks them.
    if (auto h = v.get_uint("clip.has_vision_encoder"); h && *h == 0)
        throw Error(EH_MODEL_LOAD_FAILED, "the mmproj file says it has no vision encoder (clip.has_vision_encoder)");
    I.patch = key_u32(v, "clip.vision.patch_size");
    I.width = key_u32(v, "clip.vision.embedding_length");
    I.ff = key_u32(v, "clip.vision.feed_forward_length");
    I.n_head = key_u32(v, "clip.vision.attention.head_count");
    const uint32_t n_block = key_u32(v, "clip.vision.block_count");
    if (n_block > 1024)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj block_count " + std::to_string(n_block) + " is more than 1024");
    I.eps = float(v.get_float("clip.vision.attention.layer_norm_epsilon").value_or(1e-6));
    if (v.find("clip.vision.spatial_merge_size")) I.merge = key_u32(v, "clip.vision.spatial_merge_size");
    if (I.merge != 2)
        throw Error(EH_UNSUPPORTED, "mmproj spatial_merge_size " + std::to_string(I.merge) + " (Qwen2.5-VL merges 2 x 2)");
    I.wa_pattern = uint32_t(v.get_uint("clip.vision.n_wa_pattern").value_or(0));
    uint32_t window_px = 112;
    if (v.find("clip.vision.window_size")) window_px = key_u32(v, "clip.vision.window_size");
    if (window_px % (I.patch * I.merge) != 0)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj window_size " + std::to_string(window_px) +
                                              " is not a multiple of a merged patch (" +
                                              std::to_string(I.patch * I.merge) + " pixels)");
    I.window = window_px / I.patch;
    if (I.width % I.n_head != 0 || (I.width / I.n_head) % 4 != 0)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj embedding_length " + std::to_string(I.width) + " over " +
                                              std::to_string(I.n_head) +
                                              " heads is not a head size divisible by 4 (2-D RoPE)");
    if (auto pd = v.get_uint("clip.vision.projection_dim"); pd && *pd != text_n_embd)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj projection_dim " + std::to_string(*pd) + " is not the model's width " +
                                              std::to_string(text_n_embd) + ": the projector belongs to another model");

    const uint64_t W = I.width, F = I.ff, P = 3ull * I.patch * I.patch, W4 = 4ull * I.width;
    {
        std::vector<float> pw = floats(v, "v.patch_embd.weight", W * P);
        const std::vector<float> second = floats(v, "v.patch_embd.weight.1", W * P);
        for (size_t i = 0; i < pw.size(); ++i) pw[i] += second[i];
        I.patch_w.buf = upload(pw.data(), pw.size(), ledger);
        I.patch_w.rows = int(W);
        I.patch_w.cols = int(P);
    }
    I.blocks.resize(n_block);
    bool all_half = true;
    for (uint32_t i = 0; i < n_block; ++i) {
        Impl::Block& b = I.blocks[i];
        b.ln1 = device_floats(v, vblk(i, "ln1.weight"), W, ledger);
        b.ln2 = device_floats(v, vblk(i, "ln2.weight"), W, ledger);
        b.qkv = I.block_mat(v, i, {"attn_q", "attn_k", "attn_v"}, W, W, b.qkv_b);
        all_half = all_half && b.qkv.half;
        b.o = I.block_mat(v, i, {"attn_out"}, W, W, b.o_b);
        b.gate_up = I.block_mat(v, i, {"ffn_gate", "ffn_up"}, W, F, b.gate_up_b);
        b.down = I.block_mat(v, i, {"ffn_down"}, F, W, b.down_b);
    }
    I.half_attn = n_block > 0 && all_half;
    I.flash = I.half_attn && vision::flash_takes(int(W), int(I.n_head));
    I.post_ln = device_floats(v, "v.post_ln.weight", W, ledger);
    I.mm0 = upload_mat({&matrix(v, "mm.0.weight", W4, W4)}, {"mm.0.weight"}, int(W4), int(W4), ledger);
    I.mm0_b = device_floats(v, "mm.0.bias", W4, ledger);
    const eh_tensor& t2 = v.require_tensor("mm.2.weight");
    if (t2.n_dims < 2 || t2.dims[0] != W4 || t2.dims[1] != text_n_embd)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj tensor 'mm.2.weight' must have dims {" + std::to_string(W4) + ", " +
                                              std::to_string(text_n_embd) + "} (4 x the encoder's width, the model's)");
    I.mm2 =
        upload_mat({&matrix(v, "mm.2.weight", W4, text_n_embd)}, {"mm.2.weight"}, int(text_n_embd), int(W4), ledger);
    I.mm2_b = device_floats(v, "mm.2.bias", text_n_embd, ledger);

    eh_image_encoder_info& info = I.info;
    info.struct_size = sizeof info;
    const uint32_t tile = I.patch * I.merge;
    uint32_t nominal = tile * 20;  // 560, the converter's default image_size
    if (v.find("clip.vision.image_size")) nominal = std::max(tile, key_u32(v, "clip.vision.image_size") / tile * tile);
    info.image_width = info.image_height = nominal;
    info.n_tokens = (nominal / tile) * (nominal / tile);
    info.n_embd = text_n_embd;
    info.span_flags = EH_SPAN_GRID;  // causal in the decoder, placed on its grid by M-RoPE
    three_floats(v, "clip.vision.image_mean", info.mean);
    three_floats(v, "clip.vision.image_std", info.std);
    info.tile = tile;
    info.min_tokens = kMinTokens;
    info.max_tokens = kMaxTokens;

    // Scratch for the largest image: N patches, M = N / 4 rows out.
    const size_t N = size_t(kMaxTokens) * 4, M = kMaxTokens, half = W / I.n_head / 2;
    I.pixels = DeviceBuffer(size_t(kMaxTokens) * tile * tile * 3 * 4, ledger);
    I.patches = DeviceBuffer(N * P * 4, ledger);
    I.x = DeviceBuffer(N * W * 4, ledger);
    I.h = DeviceBuffer(N * W * 4, ledger);
    I.att = DeviceBuffer(N * W * 4, ledger);
    I.tmp = DeviceBuffer(N * W * 4, ledger);
    I.mid = DeviceBuffer(M * W4 * 4, ledger);
    I.qkv = DeviceBuffer(N * 3 * W * 4, ledger);
    I.u = DeviceBuffer(N * 2 * F * 4, ledger);
    I.g = DeviceBuffer(N * F * 4, ledger);
    I.rows = DeviceBuffer(M * text_n_embd * 4, ledger);
    I.xh = DeviceBuffer(N * std::max(W, F) * 2, ledger);
    if (I.half_attn) I.qkvh = DeviceBuffer(N * 3 * W * 2, ledger);
    if (!I.flash) {
        const size_t per = std::clamp<size_t>(vision::kScoreBytes / (N * N * 4), 1, I.n_head);
        I.scores = DeviceBuffer(per * N * N * 4, ledger);
        if (I.half_attn) I.ph = DeviceBuffer(per * N * N * 2, ledger);
    }
    I.rc = DeviceBuffer(N * 2 * 4, ledger);
    I.win = DeviceBuffer(N * 4, ledger);
    I.seg = DeviceBuffer((M + 1) * 4, ledger);
    I.cs = DeviceBuffer(N * half * 4, ledger);
    I.sn = DeviceBuffer(N * half * 4, ledger);
    I.gemms.emplace();
    EHC_CHECK(cudaEventCreate(&I.t0));
    EHC_CHECK(cudaEventCreate(&I.t1));
}

QwenVlVision::~QwenVlVision() = default;

const eh_image_encoder_info& QwenVlVision::info() const { return impl_->info; }

float QwenVlVision::last_ms() const { return impl_->ms; }

void QwenVlVision::encode(const float* pixels, uint32_t width, uint32_t height, float* out) {
    Impl& I = *impl_;
    const uint32_t tile = I.info.tile;
    if (width == 0 || height == 0 || width % tile != 0 || height % tile != 0 ||
        uint64_t(width / tile) * (height / tile) < I.info.min_tokens ||
        uint64_t(width / tile) * (height / tile) > I.info.max_tokens)
        throw Error(EH_INVALID_ARGUMENT, "image_encode_sized: " + std::to_string(width) + "x" + std::to_string(height) +
                                             " is not a multiple of " + std::to_string(tile) + " pixels of " +
                                             std::to_string(I.info.min_tokens) + ".." +
                                             std::to_string(I.info.max_tokens) + " tiles");
    const vision::Gemms& gm = *I.gemms;
    cudaStream_t s = gm.stream();
    const int p = int(I.patch), W = int(I.width), F = int(I.ff), T = int(I.text), W4 = 4 * W;
    const int gh = int(height) / p, gw = int(width) / p, N = gh * gw, M = N / 4;
    const int wu = int(I.window / I.merge);  // a window's side in merged squares
    const int hd = W / int(I.n_head), half = hd / 2, quarter = hd / 4;
    // Window order (vision_qwen_layout.hpp): each window a run of rows.
    vision::qwen::WindowLayout lay = vision::qwen::window_layout(gh, gw, wu);
    I.h_rc.swap(lay.rc);
    I.h_win.swap(lay.win);
    I.h_seg.swap(lay.seg);
    I.h_unit.swap(lay.unit);
    const int max_win = lay.max_rows, n_win = int(I.h_seg.size()) - 1;
    // The 2-D RoPE's angles per patch, in double as cpu-reference takes them.
    I.h_cs.resize(size_t(N) * half);
    I.h_sn.resize(size_t(N) * half);
    for (int t = 0; t < N; ++t)
        for (int i = 0; i < half; ++i) {
            const double inv = std::pow(10000.0, -2.0 * double(i % quarter) / double(half));
            const double a = double(i < quarter ? I.h_rc[2 * t] : I.h_rc[2 * t + 1]) * inv;
            I.h_cs[size_t(t) * half + i] = float(std::cos(a));
            I.h_sn[size_t(t) * half + i] = float(std::sin(a));
        }
    EHC_CHECK(cudaEventRecord(I.t0, s));
    EHC_CHECK(cudaMemcpyAsync(I.pixels.get(), pixels, size_t(3) * width * height * 4, cudaMemcpyHostToDevice, s));
    EHC_CHECK(cudaMemcpyAsync(I.rc.get(), I.h_rc.data(), I.h_rc.size() * 4, cudaMemcpyHostToDevice, s));
    EHC_CHECK(cudaMemcpyAsync(I.win.get(), I.h_win.data(), I.h_win.size() * 4, cudaMemcpyHostToDevice, s));
    EHC_CHECK(cudaMemcpyAsync(I.seg.get(), I.h_seg.data(), I.h_seg.size() * 4, cudaMemcpyHostToDevice, s));
    EHC_CHECK(cudaMemcpyAsync(I.cs.get(), I.h_cs.data(), I.h_cs.size() * 4, cudaMemcpyHostToDevice, s));
    EHC_CHECK(cudaMemcpyAsync(I.sn.get(), I.h_sn.data(), I.h_sn.size() * 4, cudaMemcpyHostToDevice, s));

    vision::qwen::gather_patches(I.pixels.as<float>(), int(width), int(height), p, I.rc.as<int32_t>(), N,
                                 I.patches.as<float>(), s);
    gm.linear_in(I.patch_w, I.patches.get(), N, I.x.as<float>());
    float* x = I.x.as<float>();
    float* h = I.h.as<float>();
    __half* xh = I.xh.as<__half>();
    for (size_t il = 0; il < I.blocks.size(); ++il) {
        const Impl::Block& b = I.blocks[il];
        const bool full = I.wa_pattern == 0 || (il + 1) % I.wa_pattern == 0;
        vision::qwen::rms_rows(x, b.ln1.as<float>(), I.eps, N, W, h, b.qkv.half ? xh : nullptr, s);
        gm.linear_in(b.qkv, input_of(b.qkv, xh, h), N, I.qkv.as<float>());
        vision::add_bias(I.qkv.as<float>(), b.qkv_b.as<float>(), N, 3 * W, s);
        vision::qwen::rope2d(I.qkv.as<float>(), N, W, int(I.n_head), I.cs.as<float>(), I.sn.as<float>(),
                             I.half_attn ? I.qkvh.as<__half>() : nullptr, s);
        I.attention(N, full, n_win, max_win);
        gm.linear(b.o, I.att.as<float>(), N, I.tmp.as<float>(), xh);
        vision::add_residual(x, I.tmp.as<float>(), b.o_b.as<float>(), N, W, s);
        vision::qwen::rms_rows(x, b.ln2.as<float>(), I.eps, N, W, h, b.gate_up.half ? xh : nullptr, s);
        gm.linear_in(b.gate_up, input_of(b.gate_up, xh, h), N, I.u.as<float>());
        vision::qwen::swiglu_bias(I.u.as<float>(), b.gate_up_b.as<float>(), N, F, I.g.as<float>(),
                                  b.down.half ? xh : nullptr, s);
        gm.linear_in(b.down, input_of(b.down, xh, I.g.as<float>()), N, I.tmp.as<float>());
        vision::add_residual(x, I.tmp.as<float>(), b.down_b.as<float>(), N, W, s);
    }
    // The merger: each patch normed, a square's four consecutive rows read
    // as one row of 4 x width.
    vision::qwen::rms_rows(x, I.post_ln.as<float>(), I.eps, N, W, h, I.mm0.half ? xh : nullptr, s);
    gm.linear_in(I.mm0, input_of(I.mm0, xh, h), M, I.mid.as<float>());
    vision::qwen::bias_gelu_erf(I.mid.as<float>(), I.mm0_b.as<float>(), M, W4, I.mm2.half ? xh : nullptr, s);
    gm.linear_in(I.mm2, input_of(I.mm2, xh, I.mid.as<float>()), M, I.rows.as<float>());
    vision::add_bias(I.rows.as<float>(), I.mm2_b.as<float>(), M, T, s);
    I.h_rows.resize(size_t(M) * T);
    EHC_CHECK(cudaMemcpyAsync(I.h_rows.data(), I.rows.get(), I.h_rows.size() * 4, cudaMemcpyDeviceToHost, s));
    EHC_CHECK(cudaEventRecord(I.t1, s));
    EHC_CHECK(cudaStreamSynchronize(s));
    EHC_CHECK(cudaEventElapsedTime(&I.ms, I.t0, I.t1));
    // Back to tile order.
    for (int j = 0; j < M; ++j)
        std::memcpy(out + size_t(I.h_unit[size_t(j)]) * T, I.h_rows.data() + size_t(j) * T, size_t(T) * 4);
}

}  // namespace ehcuda
