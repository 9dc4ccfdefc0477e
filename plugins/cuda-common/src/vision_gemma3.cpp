#include "ehcuda/vision_gemma3.hpp"

#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <engine_host/mmproj.hpp>
#include <engine_host/plugin_abi.hpp>

#include "ehcuda/check.hpp"
#include "vision_ops.hpp"

namespace ehcuda {
namespace {

using ehp::Error;
using namespace ehp::mmproj;

void check_cublas(cublasStatus_t st, const char* what) {
    if (st == CUBLAS_STATUS_SUCCESS) return;
    throw Error(st == CUBLAS_STATUS_ALLOC_FAILED ? EH_VRAM_OOM : EH_CUDA_ERROR,
                std::string("image encoder: ") + what + " failed: " + cublasGetStatusName(st));
}

template <class T>
DeviceBuffer upload(const T* data, size_t n, MemoryLedger* ledger) {
    DeviceBuffer b(n * sizeof(T), ledger);
    EHC_CHECK(cudaMemcpy(b.get(), data, n * sizeof(T), cudaMemcpyHostToDevice));
    return b;
}

}  // namespace

struct Gemma3Vision::Impl {
    // Row-major [rows][cols]: F16 when every source tensor was F16, else F32.
    struct Mat {
        DeviceBuffer buf;
        bool half = false;
        int rows = 0, cols = 0;
    };
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
    cudaStream_t stream = nullptr;
    cublasHandle_t blas = nullptr;

    ~Impl() {
        if (blas) cublasDestroy(blas);
        if (stream) cudaStreamDestroy(stream);
    }

    Mat upload_mat(const std::vector<const eh_tensor*>& parts, const std::vector<std::string>& names, int rows_each,
                   int cols) {
        Mat m;
        m.rows = rows_each * int(parts.size());
        m.cols = cols;
        m.half = std::all_of(parts.begin(), parts.end(), [](const eh_tensor* t) { return t->type == EH_TYPE_F16; });
        const size_t n = size_t(rows_each) * cols;
        if (m.half) {
            std::vector<uint16_t> all(n * parts.size());
            for (size_t i = 0; i < parts.size(); ++i) std::memcpy(&all[i * n], parts[i]->data, n * 2);
            m.buf = upload(all.data(), all.size(), ledger);
        } else {
            std::vector<float> all;
            all.reserve(n * parts.size());
            for (size_t i = 0; i < parts.size(); ++i) {
                const std::vector<float> f = ehp::mmproj::floats(*parts[i], names[i], n);
                all.insert(all.end(), f.begin(), f.end());
            }
            m.buf = upload(all.data(), all.size(), ledger);
        }
        return m;
    }
    DeviceBuffer device_floats(const ehp::ModelView& v, const std::string& name, uint64_t n) {
        const std::vector<float> f = ehp::mmproj::floats(v, name, n);
        return upload(f.data(), f.size(), ledger);
    }

    // y[n][w.rows] = x[n][w.cols] . w^T (x F32; rounded to F16 first for an F16 matrix).
    void linear(const Mat& w, const float* x, int n, float* y) {
        if (w.half) {
            vision::to_half(x, size_t(n) * w.cols, xh.as<__half>(), stream);
            linear_in(w, xh.get(), n, y);
        } else {
            linear_in(w, x, n, y);
        }
    }
    // The same from an input already in the matrix's type.
    void linear_in(const Mat& w, const void* in, int n, float* y) {
        const float one = 1.0f, zero = 0.0f;
        const cudaDataType t = w.half ? CUDA_R_16F : CUDA_R_32F;
        check_cublas(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, w.rows, n, w.cols, &one, w.buf.get(), t, w.cols, in, t,
                                  w.cols, &zero, y, CUDA_R_32F, w.rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "cublasGemmEx");
    }

    // att[N][width] from qkv[N][3 * width] (biases added): softmax(q k^T *
    // scale) v per head, heads_per_group heads' scores at a time.
    void attention() {
        const int N = int(grid * grid), W = int(width), hd = int(width / n_head);
        const float scale = 1.0f / std::sqrt(float(hd)), one = 1.0f, zero = 0.0f;
        const void* base = qkv.get();
        cudaDataType t = CUDA_R_32F;
        size_t esz = 4;
        if (half_attn) {  // (the biases' kernel left qkv as halves in qkvh)
            base = qkvh.get();
            t = CUDA_R_16F;
            esz = 2;
        }
        if (flash) {  // one pass, no scores in memory (vision_attention.cu)
            vision::flash_attention(qkvh.as<__half>(), N, W, int(n_head), scale, att.as<float>(), stream);
            return;
        }
        const char* q = static_cast<const char*>(base);
        const long long nn = (long long)N * N;
        for (int h0 = 0; h0 < int(n_head); h0 += heads_per_group) {
            const int hg = std::min(heads_per_group, int(n_head) - h0);
            const char* qh = q + size_t(h0) * hd * esz;
            const char* kh = q + (size_t(W) + size_t(h0) * hd) * esz;
            const char* vh = q + (size_t(2) * W + size_t(h0) * hd) * esz;
            // scores (col-major keys x queries, i.e. row-major [query][key])
            check_cublas(cublasGemmStridedBatchedEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, N, N, hd, &scale, kh, t, 3 * W, hd, qh,
                                                    t, 3 * W, hd, &zero, scores.get(), CUDA_R_32F, N, nn, hg,
                                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                         "cublasGemmStridedBatchedEx (scores)");
            const void* p = scores.get();
            if (half_attn) {
                vision::softmax_rows(scores.as<float>(), hg * N, N, nullptr, ph.as<__half>(), stream);
                p = ph.get();
            } else {
                vision::softmax_rows(scores.as<float>(), hg * N, N, scores.as<float>(), nullptr, stream);
            }
            check_cublas(cublasGemmStridedBatchedEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, hd, N, N, &one, vh, t, 3 * W, hd, p, t,
                                                    N, nn, &zero, att.as<float>() + size_t(h0) * hd, CUDA_R_32F, W, hd,
                                                    hg, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                         "cublasGemmStridedBatchedEx (values)");
        }
    }
};

Gemma3Vision::Gemma3Vision(const eh_model_view* view, uint32_t text_n_embd, MemoryLedger* ledger)
    : impl_(std::make_unique<Impl>()) {
    Impl& I = *impl_;
    I.ledger = ledger;
    I.text = text_n_embd;
    const ehp::ModelView v(view);
    const std::string proj = projector_type(v);
    if (proj != "gemma3")
        throw Error(EH_UNSUPPORTED, "mmproj projector type '" + proj + "' is not supported on CUDA (gemma3, qwen2.5vl_merger are)");
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
    I.patch_w = I.upload_mat({&sized(v, "v.patch_embd.weight", W * P)}, {"v.patch_embd.weight"}, int(W), int(P));
    if (v.find_tensor("v.patch_embd.bias")) I.patch_b = I.device_floats(v, "v.patch_embd.bias", W);
    else {
        const std::vector<float> zero(W, 0.0f);
        I.patch_b = upload(zero.data(), zero.size(), ledger);
    }
    I.pos = I.device_floats(v, "v.position_embd.weight", N * W);
    I.blocks.resize(n_block);
    bool all_half = true;
    for (uint32_t i = 0; i < n_block; ++i) {
        Impl::Block& b = I.blocks[i];
        b.ln1_w = I.device_floats(v, vblk(i, "ln1.weight"), W);
        b.ln1_b = I.device_floats(v, vblk(i, "ln1.bias"), W);
        b.ln2_w = I.device_floats(v, vblk(i, "ln2.weight"), W);
        b.ln2_b = I.device_floats(v, vblk(i, "ln2.bias"), W);
        const std::string q = vblk(i, "attn_q.weight"), k = vblk(i, "attn_k.weight"), vv = vblk(i, "attn_v.weight");
        b.qkv = I.upload_mat({&matrix(v, q, W, W), &matrix(v, k, W, W), &matrix(v, vv, W, W)}, {q, k, vv}, int(W), int(W));
        all_half = all_half && b.qkv.half;
        std::vector<float> qkv_b = floats(v, vblk(i, "attn_q.bias"), W);
        for (const char* n : {"attn_k.bias", "attn_v.bias"}) {
            const std::vector<float> x = floats(v, vblk(i, n), W);
            qkv_b.insert(qkv_b.end(), x.begin(), x.end());
        }
        b.qkv_b = upload(qkv_b.data(), qkv_b.size(), ledger);
        const std::string o = vblk(i, "attn_out.weight"), up = vblk(i, "ffn_up.weight"), down = vblk(i, "ffn_down.weight");
        b.o = I.upload_mat({&matrix(v, o, W, W)}, {o}, int(W), int(W));
        b.o_b = I.device_floats(v, vblk(i, "attn_out.bias"), W);
        b.up = I.upload_mat({&matrix(v, up, W, F)}, {up}, int(F), int(W));
        b.up_b = I.device_floats(v, vblk(i, "ffn_up.bias"), F);
        b.down = I.upload_mat({&matrix(v, down, F, W)}, {down}, int(W), int(F));
        b.down_b = I.device_floats(v, vblk(i, "ffn_down.bias"), W);
    }
    I.half_attn = n_block > 0 && all_half;
    I.flash = I.half_attn && vision::flash_takes(int(W), int(I.n_head));
    I.post_w = I.device_floats(v, "v.post_ln.weight", W);
    I.post_b = I.device_floats(v, "v.post_ln.bias", W);
    I.soft = I.device_floats(v, "mm.soft_emb_norm.weight", W);
    I.proj = I.upload_mat({&gemma3_projection(v, text_n_embd, W)}, {"mm.input_projection.weight"}, int(W),
                          int(text_n_embd));

    const uint32_t g = I.grid / I.merge;
    // Scratch for one image.
    const size_t head_scores = size_t(N) * N * 4;
    I.heads_per_group = int(std::clamp<size_t>(kVisionScoreBytes / head_scores, 1, I.n_head));
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
    EHC_CHECK(cudaStreamCreateWithFlags(&I.stream, cudaStreamNonBlocking));
    check_cublas(cublasCreate(&I.blas), "cublasCreate");
    check_cublas(cublasSetStream(I.blas, I.stream), "cublasSetStream");
}

Gemma3Vision::~Gemma3Vision() = default;

const eh_image_encoder_info& Gemma3Vision::info() const { return impl_->info; }

void Gemma3Vision::encode(const float* pixels, float* out) {
    Impl& I = *impl_;
    cudaStream_t s = I.stream;
    const int N = int(I.grid * I.grid), W = int(I.width), F = int(I.ff), T = int(I.text);
    const int g = int(I.grid / I.merge), M = g * g;
    const size_t npix = 3 * size_t(I.size) * I.size;
    EHC_CHECK(cudaMemcpyAsync(I.pixels.get(), pixels, npix * 4, cudaMemcpyHostToDevice, s));
    vision::im2col(I.pixels.as<float>(), int(I.size), int(I.patch), I.patches.as<float>(), s);
    I.linear(I.patch_w, I.patches.as<float>(), N, I.tmp.as<float>());
    vision::add_bias_pos(I.tmp.as<float>(), I.patch_b.as<float>(), I.pos.as<float>(), N, W, I.x.as<float>(), s);
    float* x = I.x.as<float>();
    float* h = I.h.as<float>();
    // A GEMM's input goes to memory in its matrix's type: the kernel before
    // it writes halves (xh) for an F16 matrix, floats otherwise.
    __half* xh = I.xh.as<__half>();
    for (const Impl::Block& b : I.blocks) {
        vision::layer_norm(x, b.ln1_w.as<float>(), b.ln1_b.as<float>(), I.eps, N, W, h, s, b.qkv.half ? xh : nullptr);
        I.linear_in(b.qkv, b.qkv.half ? static_cast<const void*>(xh) : h, N, I.qkv.as<float>());
        vision::add_bias(I.qkv.as<float>(), b.qkv_b.as<float>(), N, 3 * W, s, I.half_attn ? I.qkvh.as<__half>() : nullptr);
        I.attention();
        I.linear(b.o, I.att.as<float>(), N, I.tmp.as<float>());
        vision::add_residual(x, I.tmp.as<float>(), b.o_b.as<float>(), N, W, s);
        vision::layer_norm(x, b.ln2_w.as<float>(), b.ln2_b.as<float>(), I.eps, N, W, h, s, b.up.half ? xh : nullptr);
        I.linear_in(b.up, b.up.half ? static_cast<const void*>(xh) : h, N, I.u.as<float>());
        vision::bias_gelu(I.u.as<float>(), b.up_b.as<float>(), N, F, s, b.down.half ? xh : nullptr);
        I.linear_in(b.down, b.down.half ? static_cast<const void*>(xh) : I.u.as<float>(), N, I.tmp.as<float>());
        vision::add_residual(x, I.tmp.as<float>(), b.down_b.as<float>(), N, W, s);
    }
    vision::layer_norm(x, I.post_w.as<float>(), I.post_b.as<float>(), I.eps, N, W, h, s);
    vision::pool_rms(h, int(I.grid), int(I.merge), W, I.soft.as<float>(), I.eps, I.pooled.as<float>(), s);
    // rows[M][T] = pooled[M][W] . proj[W][T]
    const float one = 1.0f, zero = 0.0f;
    const void* in = I.pooled.get();
    if (I.proj.half) {
        vision::to_half(I.pooled.as<float>(), size_t(M) * W, I.xh.as<__half>(), s);
        in = I.xh.get();
    }
    const cudaDataType t = I.proj.half ? CUDA_R_16F : CUDA_R_32F;
    check_cublas(cublasGemmEx(I.blas, CUBLAS_OP_N, CUBLAS_OP_N, T, M, W, &one, I.proj.buf.get(), t, T, in, t, W, &zero,
                              I.rows.get(), CUDA_R_32F, T, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx (projection)");
    EHC_CHECK(cudaMemcpyAsync(out, I.rows.get(), size_t(M) * T * 4, cudaMemcpyDeviceToHost, s));
    EHC_CHECK(cudaStreamSynchronize(s));
}

}  // namespace ehcuda
