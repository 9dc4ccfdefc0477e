// Host-side reference pieces for the GPU tests: an independent, block-at-a-
// time dequantizer written from the format descriptions, a generator of
// random but well-scaled quantized rows, and FP16 helpers.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace ehtest {

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
uint16_t f32_to_bf16(float f);

// Dequantizes one row of `cols` elements of `type`.
void dequant_row(uint32_t type, const uint8_t* src, int cols, float* out);

// Random bytes for `rows` rows of `cols`, with the scale fields set so that
// values are roughly in +-0.1.
std::vector<uint8_t> random_rows(uint32_t type, int rows, int cols, std::mt19937& rng, float magnitude = 0.05f);

size_t row_size(uint32_t type, int cols);

}  // namespace ehtest
