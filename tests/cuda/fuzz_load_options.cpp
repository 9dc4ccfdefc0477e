// libFuzzer target: a CUDA plugin load's options_json (ehcuda::Options) and
// the kernel plan's overrides. Every input must read or throw
// INVALID_ARGUMENT; nothing may crash, hang or read out of bounds.
//   build-fuzz/tests/cuda/fuzz_load_options -max_total_time=600
#include <cstddef>
#include <cstdint>
#include <string>

#include <engine_host/plugin_abi.hpp>
#include <ehcuda/kernel_plan.hpp>
#include <ehcuda/options.hpp>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);  // NUL-terminated for the reader
    try {
        const ehcuda::Options o(text.c_str());
        for (const std::string& k : o.keys()) (void)o.has(k);
        (void)o.integer("upload_chunk_bytes", 1 << 20, 4096, int64_t(1) << 30);
        (void)o.choice("fp16_weights", 0, {"auto", "on", "off"});
        (void)o.boolean("b", false);
        ehcuda::KernelPlan p = ehcuda::load_plan(ehcuda::DeviceTraits{9, 0, 132}, false, o);
        // Every override stays in its documented range.
        if (p.attn_early < 0 || p.attn_early > 2 || (p.attn_keys != 4 && p.attn_keys != 8) || p.pair_slots < 0 ||
            p.pair_slots > 4 || p.bulk_tile_kb < 1 || p.bulk_tile_kb > 48)
            __builtin_trap();
        o.check_known({"upload_chunk_bytes", "fp16_weights", "batch_gemm_min_tokens", "kernels"});
    } catch (const ehp::Error& e) {
        if (e.status() != EH_INVALID_ARGUMENT) __builtin_trap();
    }
    return 0;
}
