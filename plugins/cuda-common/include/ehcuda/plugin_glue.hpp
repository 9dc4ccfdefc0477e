// The ABI function table of a CUDA engine plugin, written once for all of
// them. Every entry point runs inside ehp::guard, so no exception leaves the
// library; the probe is the same CUDA capability check for every engine.
// Every entry point that runs kernels for a model installs that model's
// KernelPlan on the calling thread (PlanScope) for the call's duration.
// The batched step is the plugin's one forward path: the table exports the
// batched group and leaves every session_* member NULL (ABI 1.4), so the
// host runs a single sequence (chat, bench, /execute) as one eh_seq.
//
// A plugin supplies an Engine policy and exports the table:
//
//   struct Engine {
//       using Model = my::Model;       // has device, weight_ptrs, ledger, quant_kind,
//                                      // device_name, compute_capability, runtime_version,
//                                      // plan (its KernelPlan, chosen at load)
//       using Batch = my::Batch;       // Batch(Model&, const eh_kv_params&), a BatchBase;
//                                      // its kHidden true exports seq_hidden (ABI 1.5)
//       static const eh_plugin_info& info();
//       static std::unique_ptr<Model> load(const eh_load_params&);
//       // architecture, context_length, vocab_size, kv_bytes_per_token
//       // (the rest is common)
//       static void fill_info(const Model&, eh_model_info&);
//       // optional (ABI 1.6 LoRA adapters, lora.hpp): the three adapter
//       // calls are exported only where the engine has it
//       static std::unique_ptr<LoraAdapter> adapter_load(Model&, const eh_adapter_params&);
//   };
//   EHCUDA_EXPORT_PLUGIN(Engine)
#pragma once

#include <ehcuda/device_set.hpp>
#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <type_traits>

#include <engine_host/plugin_abi.hpp>

#include "batch.hpp"
#include "device_memory.hpp"
#include "kernels.hpp"
#include "kv_park.hpp"
#include "lora.hpp"

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
        // cudaSetDevice creates the device's context: it fails with "out of
        // memory" when another process holds the memory, which the reason says.
        err = cudaSetDevice(device);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            return no(std::string("cudaSetDevice failed: ") + cudaGetErrorString(err));
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
    using Batch = typename Engine::Batch;
    static_assert(std::is_base_of_v<BatchBase, Batch>, "Engine::Batch must derive from ehcuda::BatchBase");

    // The opaque ABI handles point at these. The batch goes before the
    // model it runs.
    struct ModelBox {
        std::unique_ptr<Model> m;
        std::unique_ptr<Batch> batch;  // from kv_init on
    };
    static ModelBox* M(const eh_model* p) { return reinterpret_cast<ModelBox*>(const_cast<eh_model*>(p)); }

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
            // (a host before 1.6 passes the 72 bytes that end before n_devices)
            if (params->struct_size < offsetof(eh_load_params, n_devices))
                throw ehp::Error(EH_INVALID_ARGUMENT, "eh_load_params too small");
            load_devices(*params, Engine::info().max_devices);  // (1.6) a set past max_devices is refused here
            *out = reinterpret_cast<eh_model*>(new ModelBox{Engine::load(*params), nullptr});
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

    // ---- KV blocks, sequences, step. Messages go to the model's slot.
    static CudaSeq* Q(eh_seq* s) { return static_cast<CudaSeq*>(s); }

    template <class Body>
    static eh_status on_model(eh_model* m, const char* call, Body&& body) {
        if (!m) return EH_INVALID_ARGUMENT;
        return ehp::guard(model_error(), [&] {
            if (!M(m)->batch && std::string_view(call) != "kv_init")
                throw ehp::Error(EH_INVALID_ARGUMENT, std::string(call) + ": kv_init was not called");
            cudaSetDevice(M(m)->m->device);
            PlanScope plan(M(m)->m->plan);
            body(*M(m));
        });
    }
    static eh_status kv_init(eh_model* m, const eh_kv_params* p, eh_kv_info* out) {
        return on_model(m, "kv_init", [&](ModelBox& box) {
            if (!out) throw ehp::Error(EH_INVALID_ARGUMENT, "kv_init: NULL argument");
            // an older host's struct is shorter: never read past it
            const eh_kv_params kp = ehp::read_kv_params(p);
            if (box.batch) throw ehp::Error(EH_INVALID_ARGUMENT, "kv_init: already called for this model");
            // F16 by default; the engine's Batch says which other types its
            // attention kernels read (Q8_0 / FP8_E4M3 on llama-cuda).
            const uint32_t kv_type = ehp::asked_kv_type(kp);
            if (kv_type != 0 && kv_type != EH_TYPE_F16) Batch::accept_kv_type(*box.m, kv_type);
            box.batch = std::make_unique<Batch>(*box.m, kp);
            ehp::fill_versioned(out, [&](eh_kv_info& i) { i = box.batch->info(); });
        });
    }
    static eh_status kv_get_info(const eh_model* m, eh_kv_info* out) {
        return on_model(const_cast<eh_model*>(m), "kv_get_info", [&](ModelBox& box) {
            if (!out) throw ehp::Error(EH_INVALID_ARGUMENT, "kv_get_info: out is NULL");
            ehp::fill_versioned(out, [&](eh_kv_info& i) { i = box.batch->info(); });
        });
    }
    static eh_status seq_create(eh_model* m, eh_seq** out) {
        if (out) *out = nullptr;
        return on_model(m, "seq_create", [&](ModelBox& box) {
            if (!out) throw ehp::Error(EH_INVALID_ARGUMENT, "seq_create: out_seq is NULL");
            box.batch->expect_idle("seq_create");
            auto s = box.batch->create();
            s->owner = m;
            *out = s.release();
        });
    }
    static eh_status seq_fork(eh_seq* src, uint32_t n_tokens, eh_seq** out) {
        if (out) *out = nullptr;
        if (!src) return EH_INVALID_ARGUMENT;
        return on_model(src->owner, "seq_fork", [&](ModelBox& box) {
            if (!out) throw ehp::Error(EH_INVALID_ARGUMENT, "seq_fork: out_seq is NULL");
            box.batch->expect_idle("seq_fork");
            auto s = box.batch->fork(*Q(src), n_tokens);
            s->owner = src->owner;
            *out = s.release();
        });
    }
    static eh_status seq_truncate(eh_seq* s, uint32_t n_tokens) {
        if (!s) return EH_INVALID_ARGUMENT;
        return on_model(s->owner, "seq_truncate", [&](ModelBox& box) {
            box.batch->expect_idle("seq_truncate");
            if (n_tokens > Q(s)->blocks.length())
                throw ehp::Error(EH_INVALID_ARGUMENT, "seq_truncate: n_tokens " + std::to_string(n_tokens) +
                                                          " exceeds the length " + std::to_string(Q(s)->blocks.length()));
            Q(s)->blocks.truncate(n_tokens);
            Q(s)->has_logits = false;
            Q(s)->has_hidden = false;
        });
    }
    static eh_status seq_set_sampling(eh_seq* s, const eh_sampling_params* p) {
        if (!s) return EH_INVALID_ARGUMENT;
        return on_model(s->owner, "seq_set_sampling", [&](ModelBox& box) {
            if (!p) throw ehp::Error(EH_INVALID_ARGUMENT, "sampling params are NULL");
            if (p->struct_size < sizeof(eh_sampling_params))
                throw ehp::Error(EH_INVALID_ARGUMENT, "eh_sampling_params.struct_size too small");
            box.batch->expect_idle("seq_set_sampling");
            box.batch->set_sampling(*Q(s), *p);
        });
    }
    static uint32_t seq_length(const eh_seq* s) { return s ? Q(const_cast<eh_seq*>(s))->blocks.length() : 0; }
    static eh_status seq_logits(eh_seq* s, const float** out_logits, uint32_t* out_n_vocab) {
        if (!s) return EH_INVALID_ARGUMENT;
        return on_model(s->owner, "seq_logits", [&](ModelBox& box) {
            box.batch->expect_idle("seq_logits");
            if (!out_logits || !out_n_vocab) throw ehp::Error(EH_INVALID_ARGUMENT, "seq_logits: NULL argument");
            if (!Q(s)->has_logits)
                throw ehp::Error(EH_INVALID_ARGUMENT, "seq_logits: the last step did not ask for logits (EH_STEP_LOGITS)");
            *out_logits = Q(s)->logits.data();
            *out_n_vocab = uint32_t(Q(s)->logits.size());
        });
    }
    // ABI 1.5, exported only where Batch::kHidden (the others refuse
    // EH_STEP_HIDDEN as an unknown flag).
    static eh_status seq_hidden(eh_seq* s, const float** out_hidden, uint32_t* out_n_embd) {
        if (!s) return EH_INVALID_ARGUMENT;
        return on_model(s->owner, "seq_hidden", [&](ModelBox& box) {
            box.batch->expect_idle("seq_hidden");
            if (!out_hidden || !out_n_embd) throw ehp::Error(EH_INVALID_ARGUMENT, "seq_hidden: NULL argument");
            if (!Q(s)->has_hidden)
                throw ehp::Error(EH_INVALID_ARGUMENT,
                                 "seq_hidden: the last step did not ask for the hidden state (EH_STEP_HIDDEN)");
            *out_hidden = Q(s)->hidden.data();
            *out_n_embd = uint32_t(Q(s)->hidden.size());
        });
    }
    static void seq_release(eh_seq* s) {
        try {
            if (!s) return;
            if (s->owner && M(s->owner)->batch) M(s->owner)->batch->forget(Q(s));
            delete Q(s);
        } catch (...) {
        }
    }
    // ABI 1.7: the host-memory tier (kv_park.hpp).
    static eh_status seq_park(eh_seq* s, uint32_t n_tokens, uint64_t max_bytes, eh_parked** out, uint64_t* out_bytes) {
        if (out) *out = nullptr;
        if (out_bytes) *out_bytes = 0;
        if (!s) return EH_INVALID_ARGUMENT;
        return on_model(s->owner, "seq_park", [&](ModelBox& box) {
            ehp::check_park(box.batch->owns(Q(s)) ? &Q(s)->blocks : nullptr, n_tokens, out, out_bytes);
            *out = box.batch->park(*Q(s), n_tokens, max_bytes, out_bytes).release();
        });
    }
    static eh_status seq_unpark(eh_model* m, const eh_parked* p, const int32_t* tokens, uint32_t n_tokens,
                                eh_seq** out) {
        if (out) *out = nullptr;
        return on_model(m, "seq_unpark", [&](ModelBox& box) {
            if (!out) throw ehp::Error(EH_INVALID_ARGUMENT, "seq_unpark: out_seq is NULL");
            auto s = box.batch->unpark(static_cast<const ParkedKv*>(p), tokens, n_tokens);
            s->owner = m;
            *out = s.release();
        });
    }
    static void parked_release(eh_parked* p) { delete static_cast<ParkedKv*>(p); }
    // ABI 1.6: LoRA adapters (lora.hpp), where the engine loads them.
    static constexpr bool kAdapters = requires(Model& m, const eh_adapter_params& p) { Engine::adapter_load(m, p); };
    static eh_status adapter_load(eh_model* m, const eh_adapter_params* p, eh_adapter** out) {
        if (out) *out = nullptr;
        if (!m) return EH_INVALID_ARGUMENT;
        return ehp::guard(model_error(), [&] {
            if (!p || !out) throw ehp::Error(EH_INVALID_ARGUMENT, "adapter_load: NULL argument");
            if (p->struct_size < sizeof(eh_adapter_params))
                throw ehp::Error(EH_INVALID_ARGUMENT, "adapter_load: eh_adapter_params.struct_size too small");
            ModelBox& box = *M(m);
            if (box.batch) box.batch->expect_idle("adapter_load");
            cudaSetDevice(box.m->device);
            PlanScope plan(box.m->plan);
            if constexpr (kAdapters) {
                std::unique_ptr<LoraAdapter> a = Engine::adapter_load(*box.m, *p);
                a->owner = m;
                *out = a.release();
            }
        });
    }
    static void adapter_release(eh_adapter* a) { delete static_cast<LoraAdapter*>(a); }
    static eh_status seq_set_adapter(eh_seq* s, eh_adapter* a) {
        if (!s) return EH_INVALID_ARGUMENT;
        return on_model(s->owner, "seq_set_adapter", [&](ModelBox& box) {
            box.batch->expect_idle("seq_set_adapter");
            if (a && a->owner != s->owner)
                throw ehp::Error(EH_INVALID_ARGUMENT, "seq_set_adapter: the adapter belongs to another model");
            const int32_t slot = a ? static_cast<LoraAdapter*>(a)->slot() : -1;
            if (Q(s)->adapter != slot && Q(s)->blocks.length() != 0)
                throw ehp::Error(EH_INVALID_ARGUMENT, "seq_set_adapter: the sequence holds " +
                                                          std::to_string(Q(s)->blocks.length()) +
                                                          " tokens computed with another adapter; only an empty "
                                                          "sequence changes adapter");
            Q(s)->adapter = slot;
        });
    }
    static eh_status step(eh_model* m, eh_step_entry* entries, uint32_t n_entries) {
        return on_model(m, "step", [&](ModelBox& box) { box.batch->step(entries, n_entries); });
    }
    static eh_status step_begin(eh_model* m, eh_step_entry* entries, uint32_t n_entries) {
        return on_model(m, "step_begin", [&](ModelBox& box) { box.batch->begin(entries, n_entries); });
    }
    static eh_status step_end(eh_model* m, int32_t* out_tokens, uint32_t n_entries) {
        return on_model(m, "step_end", [&](ModelBox& box) { box.batch->end(out_tokens, n_entries); });
    }

    // Every member this table does not name stays NULL: the session calls
    // (the step is the forward path) and whatever a later ABI appends.
    static const eh_plugin_api* api() {
        static const eh_plugin_api table = [] {
            eh_plugin_api t{};
            t.struct_size = sizeof(eh_plugin_api);
            t.abi_major = EH_ABI_MAJOR;
            t.abi_minor = EH_ABI_MINOR;
            t.info = info;
            t.plugin_last_error = plugin_last_error;
            t.probe = probe;
            t.model_load = model_load;
            t.model_get_info = model_get_info;
            t.model_check_residency = model_check_residency;
            t.model_last_error = model_last_error;
            t.model_release = model_release;
            t.kv_init = kv_init;
            t.kv_get_info = kv_get_info;
            t.seq_create = seq_create;
            t.seq_fork = seq_fork;
            t.seq_truncate = seq_truncate;
            t.seq_set_sampling = seq_set_sampling;
            t.seq_length = seq_length;
            t.seq_logits = seq_logits;
            t.seq_release = seq_release;
            t.step = step;
            t.step_begin = step_begin;
            t.step_end = step_end;
            t.seq_park = seq_park;
            t.seq_unpark = seq_unpark;
            t.parked_release = parked_release;
            if constexpr (Batch::kHidden) t.seq_hidden = seq_hidden;
            if constexpr (kAdapters) {
                t.adapter_load = adapter_load;
                t.adapter_release = adapter_release;
                t.seq_set_adapter = seq_set_adapter;
            }
            return t;
        }();
        return &table;
    }
};

}  // namespace ehcuda

// The plugin's one exported symbol, serving ABI major EH_ABI_MAJOR.
#define EHCUDA_EXPORT_PLUGIN(Engine)                                                                    \
    extern "C" EH_PLUGIN_EXPORT const eh_plugin_api* eh_plugin_entry(uint16_t host_major, uint16_t) { \
        return host_major == EH_ABI_MAJOR ? ::ehcuda::PluginGlue<Engine>::api() : nullptr;             \
    }
