// The ABI boundary of gpt-cuda: every entry point runs inside ehp::guard,
// so no exception ever leaves the library.
#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include <ehcuda/device_memory.hpp>
#include <ehcuda/kernels.hpp>

#include "model.hpp"
#include "session.hpp"

struct eh_model {
    std::unique_ptr<gpt_cuda::Model> m;
};
struct eh_session {
    std::unique_ptr<gpt_cuda::Session> s;
};

namespace {

constexpr int kMinComputeCapability = 80;

const char* const kFormats[] = {"gguf", nullptr};
const char* const kArchs[] = {"gpt2", "gpt-oss", nullptr};
const char* const kQuants[] = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "MXFP4", nullptr};

const eh_plugin_info kInfo = {
    sizeof(eh_plugin_info), "gpt-cuda", "0.1.0", "gpt-cuda", kFormats, kArchs, kQuants,
    EH_DEVICE_CUDA, kMinComputeCapability,
};

// Messages for calls on a model: per thread, valid until that thread's next
// call (models are used from several threads at once).
std::string& model_error() {
    thread_local std::string msg;
    return msg;
}

const eh_plugin_info* info() { return &kInfo; }
const char* plugin_last_error() { return ehp::thread_last_error().c_str(); }

eh_status probe(int32_t device, eh_probe_result* out) {
    return ehp::guard(ehp::thread_last_error(), [&]() -> eh_status {
        if (!out) throw ehp::Error(EH_INVALID_ARGUMENT, "probe: out is NULL");
        uint32_t size = out->struct_size;
        *out = eh_probe_result{};
        out->struct_size = size ? size : sizeof(eh_probe_result);
        auto no = [&](const std::string& why) {
            out->supported = 0;
            ehp::copy_fixed(out->reason, why);
            return EH_OK;
        };
        int count = 0;
        cudaError_t err = cudaGetDeviceCount(&count);
        int drv = 0, rt = 0;
        cudaDriverGetVersion(&drv);
        cudaRuntimeGetVersion(&rt);
        out->driver_version = drv;
        out->runtime_version = rt;
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            return no(std::string("no usable CUDA device: ") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
        }
        if (device < 0 || device >= count)
            return no("CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) + " present)");
        cudaDeviceProp prop{};
        err = cudaGetDeviceProperties(&prop, device);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            return no(std::string("cudaGetDeviceProperties failed: ") + cudaGetErrorString(err));
        }
        ehp::copy_fixed(out->device_name, prop.name);
        out->compute_capability = prop.major * 10 + prop.minor;
        out->total_memory_bytes = prop.totalGlobalMem;
        if (out->compute_capability < kMinComputeCapability)
            return no("compute capability " + std::to_string(out->compute_capability) + " is below the required " +
                      std::to_string(kMinComputeCapability));
        if (cudaSetDevice(device) != cudaSuccess) {
            (void)cudaGetLastError();
            return no("cudaSetDevice failed");
        }
        size_t fr = 0, tot = 0;
        if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) out->free_memory_bytes = fr;
        (void)cudaGetLastError();
        std::string why = ehcuda::check_kernel_image();
        if (!why.empty()) return no(why);
        out->supported = 1;
        ehp::copy_fixed(out->reason, "ok");
        return EH_OK;
    });
}

eh_status model_load(const eh_load_params* params, eh_model** out) {
    if (out) *out = nullptr;
    return ehp::guard(ehp::thread_last_error(), [&] {
        if (!params || !out) throw ehp::Error(EH_INVALID_ARGUMENT, "model_load: NULL argument");
        if (params->struct_size < sizeof(eh_load_params)) throw ehp::Error(EH_INVALID_ARGUMENT, "eh_load_params too small");
        auto m = gpt_cuda::load_model(*params);
        *out = new eh_model{std::move(m)};
    });
}

eh_status model_get_info(const eh_model* model, eh_model_info* out) {
    return ehp::guard(model_error(), [&] {
        if (!model || !out) throw ehp::Error(EH_INVALID_ARGUMENT, "NULL argument");
        const auto& m = *model->m;
        uint32_t size = out->struct_size;
        *out = eh_model_info{};
        out->struct_size = size ? size : sizeof(eh_model_info);
        ehp::copy_fixed(out->architecture, m.cfg.arch_name);
        ehp::copy_fixed(out->quant_kind, m.quant_kind);
        out->context_length = uint32_t(m.cfg.n_ctx_train);
        out->vocab_size = uint32_t(m.cfg.n_vocab);
        out->device_bytes_used = m.ledger.bytes();
        out->host_bytes_used = 0;
        ehp::copy_fixed(out->device_name, m.device_name);
        out->compute_capability = m.compute_capability;
        out->runtime_version = m.runtime_version;
    });
}

eh_status model_check_residency(eh_model* model, int32_t* resident) {
    return ehp::guard(model_error(), [&] {
        if (!model || !resident) throw ehp::Error(EH_INVALID_ARGUMENT, "NULL argument");
        *resident = 0;
        cudaSetDevice(model->m->device);
        std::string why = ehcuda::check_device_resident(model->m->weight_ptrs);
        if (!why.empty()) throw ehp::Error(EH_CUDA_ERROR, "weights not resident: " + why);
        *resident = 1;
    });
}

const char* model_last_error(const eh_model*) { return model_error().c_str(); }

void model_release(eh_model* model) {
    if (!model) return;
    try {
        cudaSetDevice(model->m->device);
    } catch (...) {
    }
    delete model;
}

eh_status session_create(eh_model* model, const eh_session_params* params, eh_session** out) {
    if (out) *out = nullptr;
    return ehp::guard(model_error(), [&] {
        if (!model || !params || !out) throw ehp::Error(EH_INVALID_ARGUMENT, "NULL argument");
        auto s = std::make_unique<gpt_cuda::Session>(*model->m, *params);
        *out = new eh_session{std::move(s)};
    });
}

eh_status session_set_sampling(eh_session* s, const eh_sampling_params* p) {
    if (!s) return EH_INVALID_ARGUMENT;
    return ehp::guard(s->s->last_error, [&] {
        if (!p) throw ehp::Error(EH_INVALID_ARGUMENT, "sampling params NULL");
        s->s->set_sampling(*p);
    });
}

eh_status session_prefill(eh_session* s, const int32_t* tokens, uint32_t n) {
    if (!s) return EH_INVALID_ARGUMENT;
    return ehp::guard(s->s->last_error, [&] { s->s->prefill(tokens, n); });
}

eh_status session_sample(eh_session* s, int32_t* out) {
    if (!s) return EH_INVALID_ARGUMENT;
    return ehp::guard(s->s->last_error, [&] {
        if (!out) throw ehp::Error(EH_INVALID_ARGUMENT, "out_token NULL");
        *out = s->s->sample();
    });
}

eh_status session_decode(eh_session* s, int32_t token, int32_t* out) {
    if (!s) return EH_INVALID_ARGUMENT;
    return ehp::guard(s->s->last_error, [&] {
        if (!out) throw ehp::Error(EH_INVALID_ARGUMENT, "out_token NULL");
        *out = s->s->decode(token);
    });
}

eh_status session_reset(eh_session* s) {
    if (!s) return EH_INVALID_ARGUMENT;
    return ehp::guard(s->s->last_error, [&] { s->s->reset(); });
}

uint32_t session_n_past(const eh_session* s) { return s ? s->s->n_past() : 0; }

eh_status session_logits(eh_session* s, const float** logits, uint32_t* n_vocab) {
    if (!s) return EH_INVALID_ARGUMENT;
    return ehp::guard(s->s->last_error, [&] {
        if (!logits || !n_vocab) throw ehp::Error(EH_INVALID_ARGUMENT, "NULL argument");
        *logits = s->s->logits();
        *n_vocab = 0;
        *n_vocab = uint32_t(s->s->n_vocab());
    });
}

const char* session_last_error(const eh_session* s) { return s ? s->s->last_error.c_str() : ""; }

void session_release(eh_session* s) { delete s; }

const eh_plugin_api kApi = {
    sizeof(eh_plugin_api), EH_ABI_MAJOR, EH_ABI_MINOR,
    info, plugin_last_error, probe,
    model_load, model_get_info, model_check_residency, model_last_error, model_release,
    session_create, session_set_sampling, session_prefill, session_sample, session_decode,
    session_reset, session_n_past, session_logits, session_last_error, session_release,
};

}  // namespace

extern "C" EH_PLUGIN_EXPORT const eh_plugin_api* eh_plugin_entry(uint16_t host_major, uint16_t /*host_minor*/) {
    return host_major == EH_ABI_MAJOR ? &kApi : nullptr;
}
