// libFuzzer target: the --gpus parser. Every input parses into 1..8 ordinals
// in range, or is refused with a message; nothing crashes or reads past the
// input.
//   build-fuzz/tests/gpu_set/fuzz_gpu_list -max_total_time=600
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpu_set.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    std::vector<int> out;
    std::string err;
    if (eh::cli::parse_gpu_list(std::string_view(text), out, err)) {
        if (out.empty() || out.size() > eh::cli::kMaxTensorParallel || !err.empty()) __builtin_trap();
        for (int d : out)
            if (d < 0 || d > eh::cli::kMaxGpuOrdinal) __builtin_trap();
    } else if (err.empty()) {
        __builtin_trap();
    }
    return 0;
}
