// The ABI boundary of llama-cuda: the shared CUDA plugin glue
// (ehcuda/plugin_glue.hpp) with this engine's description, loader and info.
#include <ehcuda/plugin_glue.hpp>

#include "batch.hpp"
#include "image_calls.hpp"
#include "lora.hpp"
#include "model.hpp"

namespace {

const char* const kFormats[] = {"gguf", "safetensors", nullptr};
const char* const kArchs[] = {"llama", "qwen2", "qwen3", "phi3", "gemma3", "qwen2vl", nullptr};
const char* const kQuants[] = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K",
                               "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", nullptr};

struct Engine {
    using Model = llama_cuda::Model;
    using Batch = llama_cuda::Batch;

    static const eh_plugin_info& info() {
        static const eh_plugin_info i = {sizeof(eh_plugin_info), "llama-cuda", "0.1.0", "llama-cuda",
                                         kFormats, kArchs, kQuants, EH_DEVICE_CUDA, 80,
                                         llama_cuda::kMaxDevices, 0};
        return i;
    }
    static std::unique_ptr<Model> load(const eh_load_params& p) {
        auto m = llama_cuda::load_model(p);
        m->view = p.view;
        return m;
    }
    static std::unique_ptr<ehcuda::LoraAdapter> adapter_load(Model& m, const eh_adapter_params& p) {
        return llama_cuda::load_adapter(m, p);
    }
    static void fill_info(const Model& m, eh_model_info& out) {
        ehp::copy_fixed(out.architecture, m.cfg.arch);
        out.context_length = uint32_t(m.cfg.n_ctx_train);
        out.vocab_size = uint32_t(m.cfg.n_vocab);
        out.kv_bytes_per_token = 2ull * m.cfg.n_layer * m.cfg.kv_dim() * 2;  // K and V, FP16 (all ranks)
    }
};

}  // namespace

// The shared glue's table with the image calls (image_calls.hpp).
extern "C" EH_PLUGIN_EXPORT const eh_plugin_api* eh_plugin_entry(uint16_t host_major, uint16_t) {
    using Glue = ehcuda::PluginGlue<Engine>;
    static const eh_plugin_api table = llama_cuda::ImageCalls<Glue>::table(*Glue::api());
    return host_major == EH_ABI_MAJOR ? &table : nullptr;
}
