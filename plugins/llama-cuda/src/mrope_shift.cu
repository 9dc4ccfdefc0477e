#include "mrope_shift.hpp"

#include <ehcuda/check.hpp>

namespace llama_cuda {
namespace {

// Block (token, head); thread i turns pair (i, i + n_rot / 2), the
// frequency and rounding of cuda-common's rope.cuh (powf, sincosf, one
// fused multiply-add each).
__global__ void mrope_shift_kernel(MropeShiftArgs a) {
    const int t = blockIdx.x, head = blockIdx.y, half = a.n_rot / 2;
    const int32_t* sh = a.d_shift + 3 * size_t(t);
    float* x = a.qkv + size_t(t) * a.ld + size_t(head) * a.head_dim;  // K follows Q in the row
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const int d = sh[i < a.sections[0] ? 0 : i < a.sections[1] ? 1 : 2];
        if (d == 0) continue;
        const float inv = powf(a.freq_base, -2.0f * float(i) / float(a.n_rot));
        float sn, cs;
        sincosf(float(d) * inv, &sn, &cs);
        const float x0 = x[i], x1 = x[i + half];
        x[i] = fmaf(x0, cs, -__fmul_rn(x1, sn));
        x[i + half] = fmaf(x1, cs, __fmul_rn(x0, sn));
    }
}

}  // namespace

void mrope_shift(const MropeShiftArgs& a, cudaStream_t stream) {
    if (a.ntok <= 0) return;
    const int threads = a.n_rot / 2 <= 32 ? 32 : a.n_rot / 2 <= 64 ? 64 : 128;
    mrope_shift_kernel<<<dim3(unsigned(a.ntok), unsigned(a.n_head + a.n_kv)), threads, 0, stream>>>(a);
    EHC_LAUNCHED("mrope_shift_kernel");
}

}  // namespace llama_cuda
