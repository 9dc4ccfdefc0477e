// The ABI boundary of gpt-cuda: the shared CUDA plugin glue
// (ehcuda/plugin_glue.hpp) with this engine's description, loader and info.
#include <ehcuda/plugin_glue.hpp>

#include "batch.hpp"
#include "lora.hpp"
#include "model.hpp"

namespace {

const char* const kFormats[] = {"gguf", nullptr};
const char* const kArchs[] = {"gpt2", "gpt-oss", "qwen3moe", nullptr};
const char* const kQuants[] = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K",
                               "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "MXFP4", nullptr};

struct Engine {
    using Model = gpt_cuda::Model;
    using Batch = gpt_cuda::Batch;

    static const eh_plugin_info& info() {
        static const eh_plugin_info i = {sizeof(eh_plugin_info), "gpt-cuda", "0.1.0", "gpt-cuda",
                                         kFormats, kArchs, kQuants, EH_DEVICE_CUDA, 80,
                                         gpt_cuda::kMaxDevices, 0};
        return i;
    }
    static std::unique_ptr<Model> load(const eh_load_params& p) {
        auto m = gpt_cuda::load_model(p);
        m->view = p.view;
        return m;
    }
    static std::unique_ptr<ehcuda::LoraAdapter> adapter_load(Model& m, const eh_adapter_params& p) {
        return gpt_cuda::load_adapter(m, p);
    }
    static void fill_info(const Model& m, eh_model_info& out) {
        ehp::copy_fixed(out.architecture, m.cfg.arch_name);
        out.context_length = uint32_t(m.cfg.n_ctx_train);
        out.vocab_size = uint32_t(m.cfg.n_vocab);
        // K and V in the batched step's FP16 pool (all ranks)
        out.kv_bytes_per_token = 2ull * m.cfg.n_layer * m.cfg.kv_dim() * 2;
    }
};

}  // namespace

EHCUDA_EXPORT_PLUGIN(Engine)
