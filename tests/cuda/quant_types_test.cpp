// Weight types on the GPU. The prefill path's slab dequantization (prefill_gemm.cu: stored rows to
// the FP16 operand cuBLAS reads) against the CPU reference's dequantization
// (plugin-abi's quant_blocks.hpp through dequant_row), element by element,
// on random blocks of every stored type the matmul takes: an element off
// by more than FP16 rounding (half a unit in the last place, plus a unit
// for a fused multiply-add rounding the float differently) fails.
#include <cuda_fp16.h>

#include <cmath>
#include <random>

#include <engine_host/plugin_abi.hpp>

#include "gpu_util.hpp"
#include "host_reference.hpp"
#include "plugin_handle.hpp"
#include "plugin_positions.hpp"
#include "prefill_gemm.hpp"
#include "tiny_model.hpp"

namespace ehtest {
namespace {

TEST(QuantSlab, DequantRowsMatchesCpuReference) {
    REQUIRE_GPU();
    const uint32_t types[] = {EH_TYPE_F32,  EH_TYPE_F16,  EH_TYPE_BF16, EH_TYPE_Q4_0,  EH_TYPE_Q4_1,  EH_TYPE_Q5_0,
                              EH_TYPE_Q5_1, EH_TYPE_Q8_0, EH_TYPE_Q4_K, EH_TYPE_Q5_K,  EH_TYPE_Q6_K,  EH_TYPE_Q2_K,
                              EH_TYPE_Q3_K, EH_TYPE_IQ4_NL, EH_TYPE_IQ4_XS};
    const int rows = 77, cols = 1280;  // 5 super-blocks a row; 77 rows: a ragged last thread block
    for (uint32_t type : types) {
        std::mt19937 rng(type * 13 + 5);
        const auto w = random_rows(type, rows, cols, rng);
        const size_t rs = row_size(type, cols);
        ASSERT_EQ(rs, ehcuda::row_bytes(type, cols)) << ehp::type_name(type);
        auto dw = to_device(w);
        ehcuda::DeviceBuffer out(size_t(rows) * cols * sizeof(__half));
        ehcuda::prefill::dequant_rows(type, dw.get(), rs, rows, cols, out.as<__half>(), nullptr);
        GPU_OK(cudaDeviceSynchronize());
        const auto got = to_host<uint16_t>(out, size_t(rows) * cols);
        std::vector<float> ref(static_cast<size_t>(cols));
        size_t bad = 0, nonzero = 0;
        for (int r = 0; r < rows; ++r) {
            dequant_row(type, w.data() + rs * r, cols, ref.data());
            for (int k = 0; k < cols; ++k) {
                const float want = ref[size_t(k)];
                const float g = f16_to_f32(got[size_t(r) * cols + k]);
                nonzero += want != 0.0f;
                // FP16 keeps 11 significant bits: 1.5 units of the last place
                const float tol = std::max(std::fabs(want) * 1.5f / 1024.0f, 6e-8f);
                if (!(std::fabs(g - want) <= tol) && bad++ < 5)
                    ADD_FAILURE() << ehp::type_name(type) << " row " << r << " col " << k << ": " << g << " vs " << want;
            }
        }
        EXPECT_EQ(bad, 0u) << ehp::type_name(type);
        EXPECT_GT(nonzero, size_t(rows) * cols / 2) << ehp::type_name(type) << ": random blocks decode mostly to zero";
    }
}

// A type no CUDA kernel decodes (a codebook IQ type) is refused at load,
// naming the tensor and the type, with EH_UNSUPPORTED; never decoded as
// something else. (The tensor's bytes are never read: no_data.)
TEST(QuantTypes, UnservedTypeIsRefusedByName) {
    REQUIRE_GPU();
    const eh_plugin_api* api = llama_cuda_api();
    ASSERT_NE(api, nullptr);
    for (uint32_t type : {EH_TYPE_IQ2_XS, EH_TYPE_IQ3_S, EH_TYPE_TQ2_0}) {
        TinySpec spec;
        spec.wtype = EH_TYPE_Q4_K;
        spec.no_data = true;
        spec.overrides["blk.1.ffn_down.weight"] = type;
        TinyModel tm(spec);
        eh_load_params lp{};
        lp.struct_size = sizeof lp;
        lp.path = "tiny";
        lp.view = tm.view();
        eh_model* m = nullptr;
        EXPECT_EQ(api->model_load(&lp, &m), EH_UNSUPPORTED) << ehp::type_name(type);
        const std::string msg = api->plugin_last_error();
        EXPECT_NE(msg.find("blk.1.ffn_down.weight"), std::string::npos) << msg;
        EXPECT_NE(msg.find(ehp::type_name(type)), std::string::npos) << msg;
        EXPECT_EQ(m, nullptr);
        if (m) api->model_release(m);
    }
}

// llama-cuda on an F16 and a BF16 checkpoint rounded from the same F32
// model gives the F32 model's logits (both through llama-cuda) within
// twice to five times what cpu-reference shows for the rounding alone
// (HalfCheckpoints.CpuReferenceF16AndBF16MatchF32: F16 2.0e-3, BF16 1.5e-2).
TEST(HalfCheckpoints, LlamaCudaF16AndBF16MatchF32) {
    REQUIRE_GPU();
    const eh_plugin_api* api = llama_cuda_api();
    ASSERT_NE(api, nullptr);
    TinySpec spec;
    spec.wtype = EH_TYPE_F32;
    spec.magnitude = 0.08f;
    TinyModel f32(spec), f16(spec), bf16(spec);
    f16.round_matrices(EH_TYPE_F16);
    bf16.round_matrices(EH_TYPE_BF16);
    std::vector<int32_t> toks;
    for (int i = 0; i < 32; ++i) toks.push_back(int32_t((i * 97 + 5) % spec.n_vocab));
    const auto ref = run_positions(api, f32.view(), toks);
    ASSERT_EQ(ref.size(), toks.size());
    const double e16 = worst_relative(run_positions(api, f16.view(), toks), ref);
    const double eb16 = worst_relative(run_positions(api, bf16.view(), toks), ref);
    std::printf("llama-cuda vs F32: F16 %.2e, BF16 %.2e\n", e16, eb16);
    EXPECT_LT(e16, 1e-2);
    EXPECT_LT(eb16, 3e-2);
}

}  // namespace
}  // namespace ehtest
