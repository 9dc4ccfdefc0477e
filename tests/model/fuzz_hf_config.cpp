// libFuzzer target: arbitrary bytes as a Hugging Face config.json through
// the host's translation into GGUF-named metadata (every model_type branch,
// rope_scaling / rope_parameters, token ids, the hf.* pass-through). The
// only acceptable failure is eh::Error(ModelLoadFailed); anything else
// escapes and libFuzzer reports it, as it does every ASan finding.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "eh/error.hpp"
#include "hf.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        eh::model::detail::ModelData m;
        (void)eh::model::detail::translate_hf_config(m, std::string_view(reinterpret_cast<const char*>(data), size),
                                                     "fuzz/config.json");
    } catch (const eh::Error& e) {
        if (e.code() != eh::Code::ModelLoadFailed) std::abort();
    }
    return 0;
}
