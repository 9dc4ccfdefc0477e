#include "host_reference.hpp"

#include <cmath>
#include <cstring>
#include <stdexcept>

#include <engine_host/quant_blocks.hpp>
#include <engine_host/tensor_types.h>

namespace ehtest {

float f16_to_f32(uint16_t h) {
    const uint32_t sign = uint32_t(h >> 15) << 31;
    const int exp = (h >> 10) & 31;
    const int man = h & 1023;
    float v;
    if (exp == 0)
        v = std::ldexp(float(man), -24);
    else if (exp == 31)
        v = man ? NAN : INFINITY;
    else
        v = std::ldexp(float(man | 1024), exp - 25);
    return sign ? -v : v;
}

uint16_t f32_to_f16(float f) {
    // Round to nearest even through the standard library's rounding.
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    float a = std::fabs(f);
    if (a >= 65520.0f) return uint16_t(sign | 0x7C00u);
    if (a < 6.103515625e-05f) {  // subnormal half
        uint32_t m = uint32_t(std::nearbyint(a * 16777216.0f));
        return uint16_t(sign | m);
    }
    int e;
    float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
    uint32_t mant = uint32_t(std::nearbyint((m * 2.0f - 1.0f) * 1024.0f));
    int he = e - 1 + 15;
    if (mant == 1024) { mant = 0; ++he; }
    return uint16_t(sign | uint32_t(he) << 10 | mant);
}

uint16_t f32_to_bf16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    x += 0x7FFFu + ((x >> 16) & 1u);
    return uint16_t(x >> 16);
}

size_t row_size(uint32_t type, int cols) {
    eh_type_traits t = eh_tensor_type_traits(type);
    return static_cast<size_t>(cols / t.block_elems) * t.block_bytes;
}

namespace {

float h(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return f16_to_f32(v);
}

void scale_min_k4(int j, const uint8_t* q, int& d, int& m) {
    if (j < 4) {
        d = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

}  // namespace

void dequant_row(uint32_t type, const uint8_t* src, int cols, float* y) {
    switch (type) {
    case EH_TYPE_F32:
        std::memcpy(y, src, static_cast<size_t>(cols) * 4);
        return;
    case EH_TYPE_F16:
        for (int i = 0; i < cols; ++i) y[i] = h(src + 2 * i);
        return;
    case EH_TYPE_BF16:
        for (int i = 0; i < cols; ++i) {
            uint32_t b = uint32_t(src[2 * i]) << 16 | uint32_t(src[2 * i + 1]) << 24;
            std::memcpy(&y[i], &b, 4);
        }
        return;
    case EH_TYPE_Q2_K:
    case EH_TYPE_Q3_K:
    case EH_TYPE_IQ4_NL:
    case EH_TYPE_IQ4_XS:
        // The types the CPU reference learnt from llama.cpp uploads: the GPU
        // kernels are checked against its dequantization (plugin-abi's
        // quant_blocks.hpp, itself checked against ggml's in
        // tests/cpu_reference/quant_blocks_test.cpp), not a second copy here.
        if (!ehp::quant::dequantize_row(type, src, y, uint64_t(cols)))
            throw std::runtime_error("dequant_row: not whole blocks");
        return;
    default:
        break;
    }
    eh_type_traits tr = eh_tensor_type_traits(type);
    const int nb = cols / int(tr.block_elems);
    for (int b = 0; b < nb; ++b) {
        const uint8_t* x = src + static_cast<size_t>(b) * tr.block_bytes;
        float* o = y + static_cast<size_t>(b) * tr.block_elems;
        switch (type) {
        case EH_TYPE_Q4_0:
            for (int j = 0; j < 16; ++j) {
                o[j] = (int(x[2 + j] & 15) - 8) * h(x);
                o[j + 16] = (int(x[2 + j] >> 4) - 8) * h(x);
            }
            break;
        case EH_TYPE_Q4_1:
            for (int j = 0; j < 16; ++j) {
                o[j] = (x[4 + j] & 15) * h(x) + h(x + 2);
                o[j + 16] = (x[4 + j] >> 4) * h(x) + h(x + 2);
            }
            break;
        case EH_TYPE_Q5_0:
        case EH_TYPE_Q5_1: {
            const bool q51 = type == EH_TYPE_Q5_1;
            uint32_t qh;
            std::memcpy(&qh, x + (q51 ? 4 : 2), 4);
            const uint8_t* qs = x + (q51 ? 8 : 6);
            for (int j = 0; j < 16; ++j) {
                int lo = (qs[j] & 15) | int((qh >> j) & 1) << 4;
                int hi = (qs[j] >> 4) | int((qh >> (j + 16)) & 1) << 4;
                if (q51) {
                    o[j] = lo * h(x) + h(x + 2);
                    o[j + 16] = hi * h(x) + h(x + 2);
                } else {
                    o[j] = (lo - 16) * h(x);
                    o[j + 16] = (hi - 16) * h(x);
                }
            }
            break;
        }
        case EH_TYPE_Q8_0:
            for (int j = 0; j < 32; ++j) o[j] = float(int8_t(x[2 + j])) * h(x);
            break;
        case EH_TYPE_Q4_K:
        case EH_TYPE_Q5_K: {
            const bool k5 = type == EH_TYPE_Q5_K;
            const float d = h(x), dmin = h(x + 2);
            const uint8_t* sc = x + 4;
            const uint8_t* qh = x + 16;
            const uint8_t* q = x + (k5 ? 48 : 16);
            int is = 0;
            for (int g = 0; g < 4; ++g) {  // 64 elements per step
                int s1, m1, s2, m2;
                scale_min_k4(is, sc, s1, m1);
                scale_min_k4(is + 1, sc, s2, m2);
                for (int l = 0; l < 32; ++l) {
                    int lo = q[l] & 15, hi = q[l] >> 4;
                    if (k5) {
                        lo += ((qh[l] >> (2 * g)) & 1) << 4;
                        hi += ((qh[l] >> (2 * g + 1)) & 1) << 4;
                    }
                    o[64 * g + l] = d * s1 * lo - dmin * m1;
                    o[64 * g + 32 + l] = d * s2 * hi - dmin * m2;
                }
                q += 32;
                is += 2;
            }
            break;
        }
        case EH_TYPE_Q6_K: {
            const float d = h(x + 208);
            const uint8_t* ql = x;
            const uint8_t* qh = x + 128;
            const int8_t* sc = reinterpret_cast<const int8_t*>(x + 192);
            for (int n = 0; n < 2; ++n) {
                for (int l = 0; l < 32; ++l) {
                    int is = l / 16;
                    int q1 = int((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32;
                    int q2 = int((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
                    int q3 = int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                    int q4 = int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                    o[128 * n + l] = d * sc[is] * q1;
                    o[128 * n + l + 32] = d * sc[is + 2] * q2;
                    o[128 * n + l + 64] = d * sc[is + 4] * q3;
                    o[128 * n + l + 96] = d * sc[is + 6] * q4;
                }
                ql += 64;
                qh += 32;
                sc += 8;
            }
            break;
        }
        default:
            throw std::runtime_error("dequant_row: unsupported type");
        }
    }
}

std::vector<uint8_t> random_rows(uint32_t type, int rows, int cols, std::mt19937& rng, float mag) {
    const size_t rs = row_size(type, cols);
    std::vector<uint8_t> out(rs * static_cast<size_t>(rows));
    std::uniform_real_distribution<float> u(0.5f, 1.5f);
    std::normal_distribution<float> nrm(0.0f, mag);
    auto put16 = [&](uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); };
    if (type == EH_TYPE_F32 || type == EH_TYPE_F16 || type == EH_TYPE_BF16) {
        size_t n = static_cast<size_t>(rows) * cols;
        for (size_t i = 0; i < n; ++i) {
            float v = nrm(rng);
            if (type == EH_TYPE_F32) std::memcpy(&out[4 * i], &v, 4);
            else put16(&out[2 * i], type == EH_TYPE_F16 ? f32_to_f16(v) : f32_to_bf16(v));
        }
        return out;
    }
    // splitmix64 for the bulk bytes: real-shape models need hundreds of MB.
    uint64_t st = (uint64_t(rng()) << 32) | rng();
    for (size_t i = 0; i < out.size(); i += 8) {
        uint64_t z = (st += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        std::memcpy(&out[i], &z, std::min<size_t>(8, out.size() - i));
    }
    eh_type_traits tr = eh_tensor_type_traits(type);
    const size_t nblocks = out.size() / tr.block_bytes;
    const float m = mag / 0.05f;
    for (size_t b = 0; b < nblocks; ++b) {
        uint8_t* x = &out[b * tr.block_bytes];
        switch (type) {
        case EH_TYPE_Q4_0: put16(x, f32_to_f16(0.012f * m * u(rng))); break;
        case EH_TYPE_Q4_1: put16(x, f32_to_f16(0.012f * m * u(rng))); put16(x + 2, f32_to_f16(-0.09f * m * u(rng))); break;
        case EH_TYPE_Q5_0: put16(x, f32_to_f16(0.006f * m * u(rng))); break;
        case EH_TYPE_Q5_1: put16(x, f32_to_f16(0.006f * m * u(rng))); put16(x + 2, f32_to_f16(-0.09f * m * u(rng))); break;
        case EH_TYPE_Q8_0: put16(x, f32_to_f16(0.0008f * m * u(rng))); break;
        case EH_TYPE_Q4_K: put16(x, f32_to_f16(0.0002f * m * u(rng))); put16(x + 2, f32_to_f16(0.0004f * m * u(rng))); break;
        case EH_TYPE_Q5_K: put16(x, f32_to_f16(0.0001f * m * u(rng))); put16(x + 2, f32_to_f16(0.0008f * m * u(rng))); break;
        case EH_TYPE_Q6_K: {
            std::uniform_int_distribution<int> sc(-20, 20);
            for (int i = 0; i < 16; ++i) x[192 + i] = uint8_t(int8_t(sc(rng)));
            put16(x + 208, f32_to_f16(0.00015f * m * u(rng)));
            break;
        }
        // (scales and codes stay random; d sets the magnitude)
        case EH_TYPE_Q2_K: put16(x + 80, f32_to_f16(0.002f * m * u(rng))); put16(x + 82, f32_to_f16(0.001f * m * u(rng))); break;
        case EH_TYPE_Q3_K: put16(x + 108, f32_to_f16(0.0005f * m * u(rng))); break;
        case EH_TYPE_IQ4_NL: put16(x, f32_to_f16(0.0004f * m * u(rng))); break;
        case EH_TYPE_IQ4_XS: put16(x, f32_to_f16(0.00002f * m * u(rng))); break;
        default: throw std::runtime_error("random_rows: unsupported type");
        }
    }
    return out;
}

}  // namespace ehtest
