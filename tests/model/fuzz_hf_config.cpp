// libFuzzer target: arbitrary bytes as a Hugging Face config.json through
// the host's translation into GGUF-named metadata (every model_type branch,
// rope_scaling / rope_parameters, token ids, the hf.* pass-through). The
// only acceptable failure is eh::Error(ModelLoadFailed); anything else
// escapes and libFuzzer reports it, as it does every ASan finding. The same
// bytes are also a tensor name through every architecture's name rules: a
// name with no GGUF equivalent comes back as "hf." + itself, any other as a
// non-empty GGUF name.
#include <cstdint>
#include <cstdlib>
#include <string>
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
    const std::string_view name(reinterpret_cast<const char*>(data), size);
    for (const char* arch : {"llama", "qwen2", "qwen2vl", "qwen3", "qwen3moe", "phi3", "gpt2", "gpt-oss", "gemma3"}) {
        const std::string g = eh::model::detail::hf_tensor_name(arch, name);
        if (g.empty() || (g.compare(0, 3, "hf.") == 0 && std::string_view(g).substr(3) != name)) std::abort();
    }
    return 0;
}
