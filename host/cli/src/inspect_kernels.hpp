// `engine-host inspect --kernels`: the CUDA kernels a step of N tokens runs
// for each weight matrix of the model, from the kernel plan a CUDA plugin
// would choose, without a GPU (the device is named, not queried).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.h>

#include "eh/model/inspect.hpp"

namespace eh::cli {

struct KernelsRequest {
    std::vector<int> batches{1};  // step token counts
    int cc_major = 9, cc_minor = 0, sm_count = 132;  // the default: H100 / H200
    bool device_given = false;
    bool mirrored = false;  // the model keeps FP16 weight mirrors (llama-cuda's fp16_weights)
};

// "1,8,64": 1 to 16 counts, each 1 .. 65536; nullopt otherwise.
std::optional<std::vector<int>> parse_batches(const std::string& s);
// "sm_90:132" (compute capability 9.0, 132 multiprocessors): major 1 .. 99,
// minor 0 .. 9, 1 .. 1024 multiprocessors; false otherwise.
bool parse_kernel_device(const std::string& s, KernelsRequest& r);

// The "Kernels" section. Throws eh::Error (ModelLoadFailed) naming a tensor
// the matrix list needs and the file lacks, InvalidArgument for a bad
// EHCUDA_PLAN.
model::InspectSection kernels_section(const eh_model_view& view, const KernelsRequest& r);

}  // namespace eh::cli
