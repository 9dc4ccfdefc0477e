// The ABI surface of the cpu-reference plugin: the static function table and
// thin wrappers that turn every exception into a status (ehp::guard).
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <string_view>
#include <string>
#include <thread>
#include <unordered_map>

#include <engine_host/plugin_abi.h>
#include <engine_host/plugin_abi.hpp>

#include "batch.hpp"
#include "lora.hpp"
#include "model.hpp"
#include "park.hpp"
#include "sequence.hpp"
#include "session.hpp"
#include "vision.hpp"

// Opaque ABI handles are these plugin types (eh_seq: sequence.hpp).
struct eh_model {
    std::unique_ptr<cpuref::Model> model;
    std::unique_ptr<cpuref::Batch> batch;  // from kv_init on
    std::unique_ptr<cpuref::ImageEncoder> vision;  // from image_encoder_load on
};
struct eh_session {
    std::unique_ptr<cpuref::Session> session;
};
struct eh_adapter {
    std::unique_ptr<cpuref::Adapter> adapter;
};

namespace {

// Must equal the lists given to engine_host_add_plugin() in CMakeLists.txt;
// the manifest test compares them.
const char* const kFormats[] = {"gguf", "safetensors", nullptr};
const char* const kArchitectures[] = {"llama", "qwen2", "qwen2vl", "qwen3", "qwen3moe", "phi3", "gpt2", "gpt-oss", "gemma3", nullptr};
const char* const kQuantKinds[] = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
                                   "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4", nullptr};

const eh_plugin_info kInfo = {
    sizeof(eh_plugin_info), "cpu-reference", CPUREF_VERSION, "cpu-reference",
    kFormats, kArchitectures, kQuantKinds, EH_DEVICE_CPU, 0,
};

unsigned default_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

// Model errors are kept per thread and per model, since model_get_info and
// model_check_residency may run concurrently with other calls.
std::unordered_map<const eh_model*, std::string>& model_error_slots() {
    thread_local std::unordered_map<const eh_model*, std::string> slots;
    return slots;
}
std::string& model_error_slot(const eh_model* m) { return model_error_slots()[m]; }

const eh_plugin_info* info() { return &kInfo; }

const char* plugin_last_error() { return ehp::thread_last_error().c_str(); }

eh_status probe(int32_t /*device*/, eh_probe_result* out) {
    return ehp::guard(ehp::thread_last_error(), [&] {
        if (!out) throw ehp::Error(EH_INVALID_ARGUMENT, "probe: out is NULL");
        if (out->struct_size < sizeof(eh_probe_result))
            throw ehp::Error(EH_INVALID_ARGUMENT, "probe: eh_probe_result.struct_size too small");
        const uint32_t size = out->struct_size;
        std::memset(out, 0, sizeof(eh_probe_result));
        out->struct_size = size;
        out->supported = 1;
        ehp::copy_fixed(out->reason, "the CPU reference engine runs on any host CPU");
        ehp::copy_fixed(out->device_name, cpuref::cpu_device_name(default_threads()));
        const long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        if (pages > 0 && page > 0) out->total_memory_bytes = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
        if (avail > 0 && page > 0) out->free_memory_bytes = static_cast<uint64_t>(avail) * static_cast<uint64_t>(page);
    });
}

eh_status model_load(const eh_load_params* params, eh_model** out_model) {
    if (out_model) *out_model = nullptr;
    return ehp::guard(ehp::thread_last_error(), [&] {
        if (!params || !out_model) throw ehp::Error(EH_INVALID_ARGUMENT, "model_load: params or out_model is NULL");
        // (a host before 1.6 passes the 72 bytes that end before n_devices)
        if (params->struct_size < offsetof(eh_load_params, n_devices))
            throw ehp::Error(EH_INVALID_ARGUMENT, "model_load: eh_load_params.struct_size too small");
        if (!params->view) throw ehp::Error(EH_INVALID_ARGUMENT, "model_load: view is NULL");
        auto m = std::make_unique<eh_model>();
        m->model = std::make_unique<cpuref::Model>(*params);
        *out_model = m.release();
    });
}

eh_status model_get_info(const eh_model* model, eh_model_info* out) {
    std::string& err = model_error_slot(model);
    return ehp::guard(err, [&] {
        if (!model || !out) throw ehp::Error(EH_INVALID_ARGUMENT, "model_get_info: NULL argument");
        const cpuref::Model& m = *model->model;
        ehp::fill_versioned(out, [&](eh_model_info& i) {
            const auto& c = m.config();
            ehp::copy_fixed(i.architecture, c.arch_name);
            ehp::copy_fixed(i.quant_kind, m.dominant_type());
            i.context_length = c.n_ctx_train;
            i.vocab_size = c.n_vocab;
            i.host_bytes_used = m.host_bytes();
            ehp::copy_fixed(i.device_name, m.device_name());
            i.kv_bytes_per_token = 2ull * c.n_layer * c.n_head_kv * c.head_dim * sizeof(float);  // host memory
        });
    });
}

eh_status model_check_residency(eh_model* model, int32_t* resident) {
    std::string& err = model_error_slot(model);
    return ehp::guard(err, [&] {
        if (!model || !resident) throw ehp::Error(EH_INVALID_ARGUMENT, "model_check_residency: NULL argument");
        // Weights are read in place from the host's mapping; nothing can move.
        *resident = model->model->view() ? 1 : 0;
        if (!*resident) err = "model view is gone";
    });
}

const char* model_last_error(const eh_model* model) { return model_error_slot(model).c_str(); }

void model_release(eh_model* model) {
    try {
        model_error_slots().erase(model);
        delete model;
    } catch (...) {
    }
}

eh_status session_create(eh_model* model, const eh_session_params* params, eh_session** out_session) {
    if (out_session) *out_session = nullptr;
    std::string& err = model_error_slot(model);
    return ehp::guard(err, [&] {
        if (!model || !params || !out_session) throw ehp::Error(EH_INVALID_ARGUMENT, "session_create: NULL argument");
        if (params->struct_size < sizeof(eh_session_params))
            throw ehp::Error(EH_INVALID_ARGUMENT, "session_create: eh_session_params.struct_size too small");
        auto s = std::make_unique<eh_session>();
        s->session = std::make_unique<cpuref::Session>(*model->model, *params);
        *out_session = s.release();
    });
}

// Session calls keep their message in the session itself.
template <class Body>
eh_status on_session(eh_session* s, Body&& body) {
    if (!s) return EH_INVALID_ARGUMENT;
    return ehp::guard(s->session->last_error, [&] { body(*s->session); });
}

eh_status session_set_sampling(eh_session* s, const eh_sampling_params* p) {
    return on_session(s, [&](cpuref::Session& ss) {
        if (!p) throw ehp::Error(EH_INVALID_ARGUMENT, "sampling params are NULL");
        if (p->struct_size < sizeof(eh_sampling_params))
            throw ehp::Error(EH_INVALID_ARGUMENT, "eh_sampling_params.struct_size too small");
        ss.set_sampling(*p);
    });
}

eh_status session_prefill(eh_session* s, const int32_t* tokens, uint32_t n) {
    return on_session(s, [&](cpuref::Session& ss) { ss.prefill(tokens, n); });
}

eh_status session_sample(eh_session* s, int32_t* out_token) {
    return on_session(s, [&](cpuref::Session& ss) {
        if (!out_token) throw ehp::Error(EH_INVALID_ARGUMENT, "out_token is NULL");
        *out_token = ss.sample();
    });
}

eh_status session_decode(eh_session* s, int32_t token, int32_t* out_token) {
    return on_session(s, [&](cpuref::Session& ss) {
        if (!out_token) throw ehp::Error(EH_INVALID_ARGUMENT, "out_token is NULL");
        *out_token = ss.decode(token);
    });
}

eh_status session_reset(eh_session* s) {
    return on_session(s, [&](cpuref::Session& ss) { ss.reset(); });
}

uint32_t session_n_past(const eh_session* s) { return s ? s->session->n_past() : 0; }

eh_status session_logits(eh_session* s, const float** out_logits, uint32_t* out_n_vocab) {
    return on_session(s, [&](cpuref::Session& ss) {
        if (!out_logits || !out_n_vocab) throw ehp::Error(EH_INVALID_ARGUMENT, "session_logits: NULL argument");
        if (!ss.has_logits()) throw ehp::Error(EH_INVALID_ARGUMENT, "no logits yet: prefill first");
        *out_logits = ss.logits().data();
        *out_n_vocab = static_cast<uint32_t>(ss.logits().size());
    });
}

const char* session_last_error(const eh_session* s) { return s ? s->session->last_error.c_str() : ""; }

void session_release(eh_session* s) {
    try {
        delete s;
    } catch (...) {
    }
}

// ---- 1.2: KV blocks, sequences, step. Messages go to the model's slot.

template <class Body>
eh_status on_model(eh_model* m, const char* call, Body&& body) {
    if (!m) return EH_INVALID_ARGUMENT;
    return ehp::guard(model_error_slot(m), [&] {
        if (!m->batch && std::string_view(call) != "kv_init")
            throw ehp::Error(EH_INVALID_ARGUMENT, std::string(call) + ": kv_init was not called");
        body();
    });
}

cpuref::Sequence* seq_of(eh_seq* s) { return static_cast<cpuref::Sequence*>(s); }

eh_status kv_init(eh_model* m, const eh_kv_params* p, eh_kv_info* out) {
    return on_model(m, "kv_init", [&] {
        if (!out) throw ehp::Error(EH_INVALID_ARGUMENT, "kv_init: NULL argument");
        const eh_kv_params kp = ehp::read_kv_params(p);
        if (m->batch) throw ehp::Error(EH_INVALID_ARGUMENT, "kv_init: already called for this model");
        m->batch = std::make_unique<cpuref::Batch>(*m->model, kp);
        ehp::fill_versioned(out, [&](eh_kv_info& i) { i = m->batch->info(); });
    });
}

eh_status kv_get_info(const eh_model* m, eh_kv_info* out) {
    auto* mm = const_cast<eh_model*>(m);
    return on_model(mm, "kv_get_info", [&] {
        if (!out) throw ehp::Error(EH_INVALID_ARGUMENT, "kv_get_info: out is NULL");
        ehp::fill_versioned(out, [&](eh_kv_info& i) { i = mm->batch->info(); });
    });
}

eh_status seq_create(eh_model* m, eh_seq** out) {
    if (out) *out = nullptr;
    return on_model(m, "seq_create", [&] {
        if (!out) throw ehp::Error(EH_INVALID_ARGUMENT, "seq_create: out_seq is NULL");
        m->batch->expect_idle("seq_create");
        auto s = m->batch->create();
        s->owner = m;
        *out = s.release();
    });
}

eh_status seq_fork(eh_seq* src, uint32_t n_tokens, eh_seq** out) {
    if (out) *out = nullptr;
    if (!src) return EH_INVALID_ARGUMENT;
    return on_model(src->owner, "seq_fork", [&] {
        if (!out) throw ehp::Error(EH_INVALID_ARGUMENT, "seq_fork: out_seq is NULL");
        src->owner->batch->expect_idle("seq_fork");
        auto s = src->owner->batch->fork(*seq_of(src), n_tokens);
        s->owner = src->owner;
        *out = s.release();
    });
}

eh_status seq_truncate(eh_seq* s, uint32_t n_tokens) {
    if (!s) return EH_INVALID_ARGUMENT;
    return on_model(s->owner, "seq_truncate", [&] {
        s->owner->batch->expect_idle("seq_truncate");
        if (n_tokens > seq_of(s)->length())
            throw ehp::Error(EH_INVALID_ARGUMENT, "seq_truncate: n_tokens " + std::to_string(n_tokens) +
                                                      " exceeds the length " + std::to_string(seq_of(s)->length()));
        seq_of(s)->truncate(n_tokens);
    });
}

eh_status seq_set_sampling(eh_seq* s, const eh_sampling_params* p) {
    if (!s) return EH_INVALID_ARGUMENT;
    return on_model(s->owner, "seq_set_sampling", [&] {
        if (!p) throw ehp::Error(EH_INVALID_ARGUMENT, "sampling params are NULL");
        if (p->struct_size < sizeof(eh_sampling_params))
            throw ehp::Error(EH_INVALID_ARGUMENT, "eh_sampling_params.struct_size too small");
        s->owner->batch->expect_idle("seq_set_sampling");
        seq_of(s)->sampler.set(*p);
    });
}

uint32_t seq_length(const eh_seq* s) { return s ? static_cast<const cpuref::Sequence*>(s)->length() : 0; }

eh_status seq_logits(eh_seq* s, const float** out_logits, uint32_t* out_n_vocab) {
    if (!s) return EH_INVALID_ARGUMENT;
    return on_model(s->owner, "seq_logits", [&] {
        if (!out_logits || !out_n_vocab) throw ehp::Error(EH_INVALID_ARGUMENT, "seq_logits: NULL argument");
        s->owner->batch->expect_idle("seq_logits");
        if (!seq_of(s)->has_logits)
            throw ehp::Error(EH_INVALID_ARGUMENT, "seq_logits: the last step did not ask for logits (EH_STEP_LOGITS)");
        *out_logits = seq_of(s)->logits.data();
        *out_n_vocab = static_cast<uint32_t>(seq_of(s)->logits.size());
    });
}

eh_status seq_hidden(eh_seq* s, const float** out_hidden, uint32_t* out_n_embd) {
    if (!s) return EH_INVALID_ARGUMENT;
    return on_model(s->owner, "seq_hidden", [&] {
        if (!out_hidden || !out_n_embd) throw ehp::Error(EH_INVALID_ARGUMENT, "seq_hidden: NULL argument");
        s->owner->batch->expect_idle("seq_hidden");
        if (!seq_of(s)->has_hidden)
            throw ehp::Error(EH_INVALID_ARGUMENT, "seq_hidden: the last step did not ask for the hidden state (EH_STEP_HIDDEN)");
        *out_hidden = seq_of(s)->hidden.data();
        *out_n_embd = static_cast<uint32_t>(seq_of(s)->hidden.size());
    });
}

void seq_release(eh_seq* s) {
    try {
        if (!s) return;
        if (s->owner && s->owner->batch) s->owner->batch->forget(seq_of(s));
        delete seq_of(s);
    } catch (...) {
    }
}

eh_status step(eh_model* m, eh_step_entry* entries, uint32_t n_entries) {
    return on_model(m, "step", [&] { m->batch->step(entries, n_entries); });
}

eh_status step_begin(eh_model* m, eh_step_entry* entries, uint32_t n_entries) {
    return on_model(m, "step_begin", [&] { m->batch->begin(entries, n_entries); });
}

eh_status step_end(eh_model* m, int32_t* out_tokens, uint32_t n_entries) {
    return on_model(m, "step_end", [&] { m->batch->end(out_tokens, n_entries); });
}

// ---- 1.6: LoRA adapters.

eh_status adapter_load(eh_model* m, const eh_adapter_params* p, eh_adapter** out) {
    if (out) *out = nullptr;
    if (!m) return EH_INVALID_ARGUMENT;
    return ehp::guard(model_error_slot(m), [&] {
        if (!p || !out) throw ehp::Error(EH_INVALID_ARGUMENT, "adapter_load: NULL argument");
        if (p->struct_size < sizeof(eh_adapter_params))
            throw ehp::Error(EH_INVALID_ARGUMENT, "adapter_load: eh_adapter_params.struct_size too small");
        if (m->batch) m->batch->expect_idle("adapter_load");
        auto a = std::make_unique<eh_adapter>();
        a->adapter = std::make_unique<cpuref::Adapter>(*m->model, *p);
        *out = a.release();
    });
}

void adapter_release(eh_adapter* a) {
    try {
        delete a;
    } catch (...) {
    }
}

eh_status seq_set_adapter(eh_seq* s, eh_adapter* a) {
    if (!s) return EH_INVALID_ARGUMENT;
    return on_model(s->owner, "seq_set_adapter", [&] {
        s->owner->batch->expect_idle("seq_set_adapter");
        const cpuref::Adapter* want = a ? a->adapter.get() : nullptr;
        if (want && &want->model() != s->owner->model.get())
            throw ehp::Error(EH_INVALID_ARGUMENT, "seq_set_adapter: the adapter belongs to another model");
        cpuref::Sequence& seq = *seq_of(s);
        if (seq.adapter != want && seq.length() != 0)
            throw ehp::Error(EH_INVALID_ARGUMENT, "seq_set_adapter: the sequence holds " + std::to_string(seq.length()) +
                                                      " tokens computed with another adapter; only an empty sequence "
                                                      "changes adapter");
        seq.adapter = want;
    });
}

// ---- 1.6: images in.

eh_status image_encoder_load(eh_model* m, const eh_model_view* view, eh_image_encoder_info* out) {
    if (!m) return EH_INVALID_ARGUMENT;
    return ehp::guard(model_error_slot(m), [&] {
        if (!view || !out) throw ehp::Error(EH_INVALID_ARGUMENT, "image_encoder_load: NULL argument");
        if (m->vision) throw ehp::Error(EH_INVALID_ARGUMENT, "image_encoder_load: an encoder is already loaded");
        if (m->batch) m->batch->expect_idle("image_encoder_load");
        auto enc = cpuref::load_image_encoder(view, m->model->config().n_embd, m->model->pool());
        // A host before 1.8 cannot see the tile, and would send images of one size.
        if (enc->info().tile && out->struct_size < offsetof(eh_image_encoder_info, reserved))
            throw ehp::Error(EH_UNSUPPORTED, "image_encoder_load: this encoder reads each image at its own size, "
                                             "which needs a host of ABI 1.8 (eh_image_encoder_info.tile)");
        m->vision = std::move(enc);
        ehp::fill_versioned(out, [&](eh_image_encoder_info& i) { i = m->vision->info(); });
    });
}

eh_status image_encode(eh_model* m, const float* pixels, float* out_rows) {
    if (!m) return EH_INVALID_ARGUMENT;
    return ehp::guard(model_error_slot(m), [&] {
        if (!pixels || !out_rows) throw ehp::Error(EH_INVALID_ARGUMENT, "image_encode: NULL argument");
        if (!m->vision) throw ehp::Error(EH_INVALID_ARGUMENT, "image_encode: no encoder loaded (image_encoder_load)");
        if (m->batch) m->batch->expect_idle("image_encode");
        const eh_image_encoder_info& i = m->vision->info();
        if (i.tile)
            throw ehp::Error(EH_INVALID_ARGUMENT, "image_encode: this encoder takes each image at its own size "
                                                  "(image_encode_sized, ABI 1.8)");
        m->vision->encode(pixels, i.image_width, i.image_height, out_rows);
    });
}

eh_status image_encode_sized(eh_model* m, const float* pixels, uint32_t width, uint32_t height, float* out_rows) {
    if (!m) return EH_INVALID_ARGUMENT;
    return ehp::guard(model_error_slot(m), [&] {
        if (!pixels || !out_rows) throw ehp::Error(EH_INVALID_ARGUMENT, "image_encode_sized: NULL argument");
        if (!m->vision)
            throw ehp::Error(EH_INVALID_ARGUMENT, "image_encode_sized: no encoder loaded (image_encoder_load)");
        if (!m->vision->info().tile)
            throw ehp::Error(EH_INVALID_ARGUMENT, "image_encode_sized: this encoder takes one size (image_encode)");
        if (m->batch) m->batch->expect_idle("image_encode_sized");
        m->vision->encode(pixels, width, height, out_rows);
    });
}

eh_status seq_embd_spans(eh_seq* s, const eh_embd_span* spans, uint32_t n_spans) {
    if (!s) return EH_INVALID_ARGUMENT;
    return on_model(s->owner, "seq_embd_spans", [&] {
        s->owner->batch->expect_idle("seq_embd_spans");
        if (n_spans && !spans) throw ehp::Error(EH_INVALID_ARGUMENT, "seq_embd_spans: spans is NULL");
        seq_of(s)->spans.assign(spans, spans + n_spans);
    });
}

// ---- 1.7: the host-memory tier (park.hpp).

eh_status seq_park(eh_seq* s, uint32_t n_tokens, uint64_t max_bytes, eh_parked** out, uint64_t* out_bytes) {
    if (out) *out = nullptr;
    if (out_bytes) *out_bytes = 0;
    if (!s) return EH_INVALID_ARGUMENT;
    return on_model(s->owner, "seq_park", [&] {
        s->owner->batch->expect_idle("seq_park");
        ehp::check_park(s->owner->batch->owns(seq_of(s)) ? &seq_of(s)->blocks : nullptr, n_tokens, out, out_bytes);
        *out = cpuref::park(s->owner, *seq_of(s), n_tokens, max_bytes, out_bytes).release();
    });
}

eh_status seq_unpark(eh_model* m, const eh_parked* p, const int32_t* tokens, uint32_t n_tokens, eh_seq** out) {
    if (out) *out = nullptr;
    return on_model(m, "seq_unpark", [&] {
        if (!out) throw ehp::Error(EH_INVALID_ARGUMENT, "seq_unpark: out_seq is NULL");
        m->batch->expect_idle("seq_unpark");
        auto s = cpuref::unpark(*m->batch, m, static_cast<const cpuref::Parked*>(p), tokens, n_tokens);
        s->owner = m;
        *out = s.release();
    });
}

void parked_release(eh_parked* p) { delete static_cast<cpuref::Parked*>(p); }

const eh_plugin_api kApi = {
    sizeof(eh_plugin_api), EH_ABI_MAJOR, EH_ABI_MINOR,
    info, plugin_last_error, probe,
    model_load, model_get_info, model_check_residency, model_last_error, model_release,
    session_create, session_set_sampling, session_prefill, session_sample, session_decode,
    session_reset, session_n_past, session_logits, session_last_error, session_release,
    kv_init, kv_get_info, seq_create, seq_fork, seq_truncate, seq_set_sampling, seq_length, seq_logits,
    seq_release, step, step_begin, step_end,
    seq_hidden,
    adapter_load, adapter_release, seq_set_adapter,
    image_encoder_load, image_encode, seq_embd_spans,
    seq_park, seq_unpark, parked_release,
    image_encode_sized,
};

}  // namespace

extern "C" EH_PLUGIN_EXPORT const eh_plugin_api* eh_plugin_entry(uint16_t host_abi_major, uint16_t /*host_abi_minor*/) {
    // Only the major must match: the host checks our abi_minor against the
    // minor it needs, and reads struct_size to see which members we know.
    return host_abi_major == EH_ABI_MAJOR ? &kApi : nullptr;
}
