// The ABI function table of a CUDA engine plugin, written once for all of
// them. Every entry point runs inside ehp::guard, so no exception leaves the
// library; the probe is the same CUDA capability check for every engine.
//
// A plugin supplies an Engine policy and exports the table:
//
//   struct Engine {
//       using Model = my::Model;       // has device, weight_ptrs, ledger, quant_kind,
//                                      // device_name, compute_capability, runtime_version
//       using Session = my::Session;   // Session(Model&, const eh_session_params&),
//                                      // last_error, set_sampling, prefill, sample,
//                                      // decode, reset, n_past, logits, n_vocab
//       static const eh_plugin_info& info();
//       static std::unique_ptr<Model> load(const eh_load_params&);
//       // architecture, context_length, vocab_size, kv_bytes_per_token
//       // (the rest is common)
//       static void fill_info(const Model&, eh_model_info&);
//   };
//   EHCUDA_EXPORT_PLUGIN(Engine)
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include <engine_host/plugin_abi.hpp>

#include "device_memory.hpp"
#include "kernels.hpp"

namespace ehcuda {

// Can this device run the plugin? Fills a full-size eh_probe_result.
inline eh_status probe_into(int32_t device, uint32_t min_cc, eh_probe_result* out) {
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
        if (uint32_t(out->compute_capability) < min_cc)
            return no("compute capability " + std::to_string(out->compute_capability) + " is below the required " +
                      std::to_string(min_cc));
        if (cudaSetDevice(device) != cudaSuccess) {
            (void)cudaGetLastError();
            return no("cudaSetDevice failed");
        }
        size_t fr = 0, tot = 0;
        if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) out->free_memory_bytes = fr;
        (void)cudaGetLastError();
        std::string why = check_kernel_image();
        if (!why.empty()) return no(why);
        out->supported = 1;
        ehp::copy_fixed(out->reason, "ok");
        return EH_OK;
}

// probe() of every CUDA plugin: never throws, writes only what the caller's
// struct_size covers.
inline eh_status probe_cuda_device(int32_t device, uint32_t min_cc, eh_probe_result* result) {
    return ehp::guard(ehp::thread_last_error(), [&]() -> eh_status {
        if (!result) throw ehp::Error(EH_INVALID_ARGUMENT, "probe: out is NULL");
        eh_status st = EH_OK;
        ehp::fill_versioned(result, [&](eh_probe_result& r) { st = probe_into(device, min_cc, &r); });
        return st;
    });
}

template <class Engine>
struct PluginGlue {
    using Model = typename Engine::Model;
    using Session = typename Engine::Session;

    // The opaque ABI handles point at these.
    struct ModelBox { std::unique_ptr<Model> m; };
    struct SessionBox { std::unique_ptr<Session> s; };
    static ModelBox* M(const eh_model* p) { return reinterpret_cast<ModelBox*>(const_cast<eh_model*>(p)); }
    static SessionBox* S(const eh_session* p) { return reinterpret_cast<SessionBox*>(const_cast<eh_session*>(p)); }

    // Messages for calls on a model: per thread, valid until that thread's
    // next call (a model is used from several threads at once).
    static std::string& model_error() {
        thread_local std::string msg;
        return msg;
    }

    static const eh_plugin_info* info() { return &Engine::info(); }
    static const char* plugin_last_error() { return ehp::thread_last_error().c_str(); }
    static eh_status probe(int32_t device, eh_probe_result* out) {
        return probe_cuda_device(device, Engine::info().min_compute_capability, out);
    }

    static eh_status model_load(const eh_load_params* params, eh_model** out) {
        if (out) *out = nullptr;
        return ehp::guard(ehp::thread_last_error(), [&] {
            if (!params || !out) throw ehp::Error(EH_INVALID_ARGUMENT, "model_load: NULL argument");
            if (params->struct_size < sizeof(eh_load_params))
                throw ehp::Error(EH_INVALID_ARGUMENT, "eh_load_params too small");
            *out = reinterpret_cast<eh_model*>(new ModelBox{Engine::load(*params)});
        });
    }

    static eh_status model_get_info(const eh_model* model, eh_model_info* out) {
        return ehp::guard(model_error(), [&] {
            if (!model || !out) throw ehp::Error(EH_INVALID_ARGUMENT, "NULL argument");
            const Model& m = *M(model)->m;
            ehp::fill_versioned(out, [&](eh_model_info& i) {
                ehp::copy_fixed(i.quant_kind, m.quant_kind);
                i.device_bytes_used = m.ledger.bytes();
                ehp::copy_fixed(i.device_name, m.device_name);
                i.compute_capability = m.compute_capability;
                i.runtime_version = m.runtime_version;
                Engine::fill_info(m, i);
            });
        });
    }

    static eh_status model_check_residency(eh_model* model, int32_t* resident) {
        return ehp::guard(model_error(), [&] {
            if (!model || !resident) throw ehp::Error(EH_INVALID_ARGUMENT, "NULL argument");
            *resident = 0;
            cudaSetDevice(M(model)->m->device);
            std::string why = check_device_resident(M(model)->m->weight_ptrs);
            if (!why.empty()) throw ehp::Error(EH_CUDA_ERROR, "weights not resident: " + why);
            *resident = 1;
        });
    }

    static const char* model_last_error(const eh_model*) { return model_error().c_str(); }

    static void model_release(eh_model* model) {
        if (!model) return;
        cudaSetDevice(M(model)->m->device);
        delete M(model);
    }

    static eh_status session_create(eh_model* model, const eh_session_params* params, eh_session** out) {
        if (out) *out = nullptr;
        return ehp::guard(model_error(), [&] {
            if (!model || !params || !out) throw ehp::Error(EH_INVALID_ARGUMENT, "NULL argument");
            auto s = std::make_unique<Session>(*M(model)->m, *params);
            *out = reinterpret_cast<eh_session*>(new SessionBox{std::move(s)});
        });
    }

    // Runs `body` on the session, with the session's own last-error.
    template <class Body>
    static eh_status on(eh_session* s, Body&& body) {
        if (!s) return EH_INVALID_ARGUMENT;
        Session& sess = *S(s)->s;
        return ehp::guard(sess.last_error, [&] { body(sess); });
    }

    static eh_status session_set_sampling(eh_session* s, const eh_sampling_params* p) {
        return on(s, [&](Session& x) {
            if (!p) throw ehp::Error(EH_INVALID_ARGUMENT, "sampling params NULL");
            x.set_sampling(*p);
        });
    }
    static eh_status session_prefill(eh_session* s, const int32_t* tokens, uint32_t n) {
        return on(s, [&](Session& x) { x.prefill(tokens, n); });
    }
    static eh_status session_sample(eh_session* s, int32_t* out) {
        return on(s, [&](Session& x) {
            if (!out) throw ehp::Error(EH_INVALID_ARGUMENT, "out_token NULL");
            *out = x.sample();
        });
    }
    static eh_status session_decode(eh_session* s, int32_t token, int32_t* out) {
        return on(s, [&](Session& x) {
            if (!out) throw ehp::Error(EH_INVALID_ARGUMENT, "out_token NULL");
            *out = x.decode(token);
        });
    }
    static eh_status session_reset(eh_session* s) {
        return on(s, [&](Session& x) { x.reset(); });
    }
    static uint32_t session_n_past(const eh_session* s) { return s ? S(s)->s->n_past() : 0; }
    static eh_status session_logits(eh_session* s, const float** logits, uint32_t* n_vocab) {
        return on(s, [&](Session& x) {
            if (!logits || !n_vocab) throw ehp::Error(EH_INVALID_ARGUMENT, "NULL argument");
            *logits = x.logits();
            *n_vocab = uint32_t(x.n_vocab());
        });
    }
    static const char* session_last_error(const eh_session* s) { return s ? S(s)->s->last_error.c_str() : ""; }
    static void session_release(eh_session* s) { delete S(s); }

    static const eh_plugin_api* api() {
        static const eh_plugin_api table = {
            sizeof(eh_plugin_api), EH_ABI_MAJOR, EH_ABI_MINOR,
            info, plugin_last_error, probe,
            model_load, model_get_info, model_check_residency, model_last_error, model_release,
            session_create, session_set_sampling, session_prefill, session_sample, session_decode,
            session_reset, session_n_past, session_logits, session_last_error, session_release,
        };
        return &table;
    }
};

}  // namespace ehcuda

// The plugin's one exported symbol, serving ABI major EH_ABI_MAJOR.
#define EHCUDA_EXPORT_PLUGIN(Engine)                                                                    \
    extern "C" EH_PLUGIN_EXPORT const eh_plugin_api* eh_plugin_entry(uint16_t host_major, uint16_t) { \
        return host_major == EH_ABI_MAJOR ? ::ehcuda::PluginGlue<Engine>::api() : nullptr;             \
    }
