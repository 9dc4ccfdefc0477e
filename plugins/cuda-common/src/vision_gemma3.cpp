#include "ehcuda/vision_gemma3.hpp"

#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include <engine_host/mmproj.hpp>
#include <engine_host/plugin_abi.hpp>

#include "ehcuda/check.hpp"
#include "vision_ops.hpp"
#include "vision_tower.hpp"

namespace ehcuda {

using ehp::Error;
using namespace ehp::mmproj;
using vision::check_cublas;
using vision::device_floats;
using vision::input_of;
using vision::Mat;
using vision::upload;
using vision::upload_mat;

struct Gemma3Vision::Impl {
    struct Block {
        DeviceBuffer ln1_w, ln1_b, ln2_w, ln2_b;
        Mat qkv, o, up, down;  // qkv: attn_q, attn_k, attn_v stacked (3 * width rows)
        DeviceBuffer qkv_b, o_b, up_b, down_b;
    };
    MemoryLedger* ledger = nullptr;
    eh_image_encoder_info info{};
    uint32_t size = 0, patch = 0, grid = 0, merge = 0, width = 0, ff = 0, n_head = 0, text = 0;
    float eps = 1e-6f;
    Mat patch_w;  // [width][3 * patch * patch]
    DeviceBuffer patch_b, pos;
    std::vector<Block> blocks;
    DeviceBuffer post_w, post_b, soft;
    Mat proj;  // [width][text]: GGUF dims {text, width}, read as is (y = x . proj)
    // Scratch.
    int heads_per_group = 1;
    bool half_attn = false;
    bool flash = false;  // half_attn on the flash kernel (vision::flash_takes), else the GEMMs
    DeviceBuffer pixels, patches, x, h, qkv, att, tmp, u, scores, pooled, rows, xh, qkvh, ph;
    std::optional<vision::Gemms> gemms;  // last: created once the weights are up, gone before the buffers

    // att[N][width] from qkv[N][3 * width] (biases added): softmax(q k^T *
    // scale) v per head, heads_per_group heads' scores at a time.
    void attention() {
        const int N = int(grid * grid), W = int(width), hd = int(width / n_head);
        const float scale = 1.0f / std::sqrt(float(hd));
        if (flash) {  // one pass, no scores in memory (vision_attention.cu)
            vision::flash_attention(qkvh.as<__half>(), N, W, int(n_head), scale, att.as<float>(), gemms->stream());
            return;
        }
        // (with half_attn the biases' kernel left qkv as halves in qkvh)
        const vision::GemmAttention a{half_attn ? qkvh.get() : qkv.get(), half_attn, N, W, int(n_head), heads_per_group,
                                      scale, scores.as<float>(), ph.as<__half>(), att.as<float>()};
        gemms->attention(a, [&](int hg, float* outf, __half* outh) {
            vision::softmax_rows(scores.as<float>(), hg * N, N, outf, outh, gemms->stream());
        });
    }
};

Gemma3Vision::Gemma3Vision(const eh_model_view* view, uint32_t text_n_embd, MemoryLedger* ledger)
    : impl_(std::make_unique<Impl>()) {
    Impl& I = *impl_;
    I.ledger = ledger;
    I.text = text_n_embd;
    const ehp::ModelView v(view);
    vision::require_projector(v, "gemma3", "is not supported on CUDA (gemma3, qwen2.5vl_merger are)");
    const Gemma3Shape sh = gemma3_shape(v, text_n_embd);
    I.size = sh.size;
    I.patch = sh.patch;
    I.grid = sh.grid;
    I.merge = sh.merge;
    I.width = sh.width;
    I.ff = sh.ff;
    I.n_head = sh.n_head;
    I.eps = sh.eps;
    I.info = sh.info;
    const uint32_t n_block = sh.n_block;
    // One image's patches must fit the cuBLAS calls' int sizes: grid^2 rows
    // of scores of grid^2 floats per head.
    if (uint64_t(I.grid) * I.grid > 32768)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj patch grid " + std::to_string(I.grid) + "x" + std::to_string(I.grid) +
                                              " is more than 32768 patches");

    const uint64_t W = I.width, F = I.ff, P = 3ull * I.patch * I.patch, N = uint64_t(I.grid) * I.grid;
    I.patch_w =
        upload_mat({&sized(v, "v.patch_embd.weight", W * P)}, {"v.patch_embd.weight"}, int(W), int(P), ledger);
    if (v.find_tensor("v.patch_embd.bias")) I.patch_b = device_floats(v, "v.patch_embd.bias", W, ledger);
    else {
        const std::vector<float> zero(W, 0.0f);
        I.patch_b = upload(zero.data(), zero.size(), ledger);
    }
    I.pos = device_floats(v, "v.position_embd.weight", N * W, ledger);
    I.blocks.resize(n_block);
    bool all_half = true;
    for (uint32_t i = 0; i < n_block; ++i) {
        Impl::Block& b = I.blocks[i];
        b.ln1_w = device_floats(v, vblk(i, "ln1.weight"), W, ledger);
        b.ln1_b = device_floats(v, vblk(i, "ln1.bias"), W, ledger);
        b.ln2_w = device_floats(v, vblk(i, "ln2.weight"), W, ledger);
        b.ln2_b = device_floats(v, vblk(i, "ln2.bias"), W, ledger);
        const std::string q = vblk(i, "attn_q.weight"), k = vblk(i, "attn_k.weight"), vv = vblk(i, "attn_v.weight");
        b.qkv = upload_mat({&matrix(v, q, W, W), &matrix(v, k, W, W), &matrix(v, vv, W, W)}, {q, k, vv}, int(W), int(W),
                           ledger);
        all_half = all_half && b.qkv.half;
        std::vector<float> qkv_b = floats(v, vblk(i, "attn_q.bias"), W);
        for (const char* n : {"attn_k.bias", "attn_v.bias"}) {
            const std::vector<float> x = floats(v, vblk(i, n), W);
            qkv_b.insert(qkv_b.end(), x.begin(), x.end());
        }
        b.qkv_b = upload(qkv_b.data(), qkv_b.size(), ledger);
        const std::string o = vblk(i, "attn_out.weight"), up = vblk(i, "ffn_up.weight"), down = vblk(i, "ffn_down.weight");
        b.o = upload_mat({&matrix(v, o, W, W)}, {o}, int(W), int(W), ledger);
        b.o_b = device_floats(v, vblk(i, "attn_out.bias"), W, ledger);
        b.up = upload_mat({&matrix(v, up, W, F)}, {up}, int(F), int(W), ledger);
        b.up_b = device_floats(v, vblk(i, "ffn_up.bias"), F, ledger);
        b.down = upload_mat({&matrix(v, down, F, W)}, {down}, int(W), int(F), ledger);
        b.down_b = device_floats(v, vblk(i, "ffn_down.bias"), W, ledger);
    }
    I.half_attn = n_block > 0 && all_half;
    I.flash = I.half_attn && vision::flash_takes(int(W), int(I.n_head));
    I.post_w = device_floats(v, "v.post_ln.weight", W, ledger);
    I.post_b = device_floats(v, "v.post_ln.bias", W, ledger);
    I.soft = device_floats(v, "mm.soft_emb_norm.weight", W, ledger);
    I.proj = upload_mat({&gemma3_projection(v, text_n_embd, W)}, {"mm.input_projection.weight"}, int(W),
                          int(text_n_embd), ledger);

    const uint32_t g = I.grid / I.merge;
    // Scratch for one image.
    const size_t head_scores = size_t(N) * N * 4;
    I.heads_per_group = int(std::clamp<size_t>(vision::kScoreBytes / head_scores, 1, I.n_head));
    const size_t M = size_t(g) * g;
    I.pixels = DeviceBuffer(3 * size_t(I.size) * I.size * 4, ledger);
    I.patches = DeviceBuffer(N * P * 4, ledger);
    I.x = DeviceBuffer(N * W * 4, ledger);
    I.h = DeviceBuffer(N * W * 4, ledger);
    I.qkv = DeviceBuffer(N * 3 * W * 4, ledger);
    I.att = DeviceBuffer(N * W * 4, ledger);
    I.tmp = DeviceBuffer(N * W * 4, ledger);
    I.u = DeviceBuffer(N * F * 4, ledger);
    if (!I.flash) I.scores = DeviceBuffer(size_t(I.heads_per_group) * head_scores, ledger);
    I.pooled = DeviceBuffer(M * W * 4, ledger);
    I.rows = DeviceBuffer(M * text_n_embd * 4, ledger);
    I.xh = DeviceBuffer(N * std::max({P, W, F}) * 2, ledger);  // a GEMM's F16 input (an F16 matrix)
    if (I.half_attn) {
        I.qkvh = DeviceBuffer(N * 3 * W * 2, ledger);
        if (!I.flash) I.ph = DeviceBuffer(size_t(I.heads_per_group) * N * N * 2, ledger);
    }
    I.gemms.emplace();
}

Gemma3Vision::~Gemma3Vision() = default;

const eh_image_encoder_info& Gemma3Vision::info() const { return impl_->info; }

void Gemma3Vision::encode(const float* pixels, float* out) {
    Impl& I = *impl_;
    const vision::Gemms& gm = *I.gemms;
    cudaStream_t s = gm.stream();
    const int N = int(I.grid * I.grid), W = int(I.width), F = int(I.ff), T = int(I.text);
    const int g = int(I.grid / I.merge), M = g * g;
    const size_t npix = 3 * size_t(I.size) * I.size;
    EHC_CHECK(cudaMemcpyAsync(I.pixels.get(), pixels, npix * 4, cudaMemcpyHostToDevice, s));
    vision::im2col(I.pixels.as<float>(), int(I.size), int(I.patch), I.patches.as<float>(), s);
    // A GEMM's input goes to memory in its matrix's type: the kernel before
    // it writes halves (xh) for an F16 matrix, floats otherwise.
    __half* xh = I.xh.as<__half>();
    gm.linear(I.patch_w, I.patches.as<float>(), N, I.tmp.as<float>(), xh);
    vision::add_bias_pos(I.tmp.as<float>(), I.patch_b.as<float>(), I.pos.as<float>(), N, W, I.x.as<float>(), s);
    float* x = I.x.as<float>();
    float* h = I.h.as<float>();
    for (const Impl::Block& b : I.blocks) {
        vision::layer_norm(x, b.ln1_w.as<float>(), b.ln1_b.as<float>(), I.eps, N, W, h, s, b.qkv.half ? xh : nullptr);
        gm.linear_in(b.qkv, input_of(b.qkv, xh, h), N, I.qkv.as<float>());
        vision::add_bias(I.qkv.as<float>(), b.qkv_b.as<float>(), N, 3 * W, s, I.half_attn ? I.qkvh.as<__half>() : nullptr);
        I.attention();
        gm.linear(b.o, I.att.as<float>(), N, I.tmp.as<float>(), xh);
        vision::add_residual(x, I.tmp.as<float>(), b.o_b.as<float>(), N, W, s);
        vision::layer_norm(x, b.ln2_w.as<float>(), b.ln2_b.as<float>(), I.eps, N, W, h, s, b.up.half ? xh : nullptr);
        gm.linear_in(b.up, input_of(b.up, xh, h), N, I.u.as<float>());
        vision::bias_gelu(I.u.as<float>(), b.up_b.as<float>(), N, F, s, b.down.half ? xh : nullptr);
        gm.linear_in(b.down, input_of(b.down, xh, I.u.as<float>()), N, I.tmp.as<float>());
        vision::add_residual(x, I.tmp.as<float>(), b.down_b.as<float>(), N, W, s);
    }
    vision::layer_norm(x, I.post_w.as<float>(), I.post_b.as<float>(), I.eps, N, W, h, s);
    vision::pool_rms(h, int(I.grid), int(I.merge), W, I.soft.as<float>(), I.eps, I.pooled.as<float>(), s);
    // rows[M][T] = pooled[M][W] . proj[W][T]
    const float one = 1.0f, zero = 0.0f;
    const void* in = I.pooled.get();
    if (I.proj.half) {
        vision::to_half(I.pooled.as<float>(), size_t(M) * W, xh, s);
        in = xh;
    }
    const cudaDataType t = I.proj.half ? CUDA_R_16F : CUDA_R_32F;
    check_cublas(cublasGemmEx(gm.blas(), CUBLAS_OP_N, CUBLAS_OP_N, T, M, W, &one, I.proj.buf.get(), t, T, in, t, W, &zero,
                              I.rows.get(), CUDA_R_32F, T, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx (projection)");
    EHC_CHECK(cudaMemcpyAsync(out, I.rows.get(), size_t(M) * T * 4, cudaMemcpyDeviceToHost, s));
    EHC_CHECK(cudaStreamSynchronize(s));
}

}  // namespace ehcuda
