#include "eh/loader/engine.hpp"

#include <cstddef>

#include "eh/error.hpp"

namespace eh {
namespace {

// A plugin that lets a C++ exception escape is buggy; keep the host up and
// report it as INTERNAL instead of unwinding through foreign frames further.
template <class F>
eh_status call(F&& f) {
    try {
        return f();
    } catch (const std::exception& e) {
        throw Error(Code::Internal, std::string("plugin threw a C++ exception across the ABI: ") + e.what());
    } catch (...) {
        throw Error(Code::Internal, "plugin threw a C++ exception across the ABI");
    }
}

std::string message_or(const char* msg, const char* fallback) {
    return msg && *msg ? std::string(msg) : std::string(fallback);
}

void progress_thunk(void* user, float fraction, const char* stage) {
    auto* fn = static_cast<std::function<void(float, const char*)>*>(user);
    try {
        (*fn)(fraction, stage ? stage : "");
    } catch (...) {
        // A host-side progress listener must never unwind into the plugin.
    }
}

int32_t cancel_thunk(void* user) {
    auto* fn = static_cast<std::function<bool()>*>(user);
    try {
        return (*fn)() ? 1 : 0;
    } catch (...) {
        return 1;
    }
}

}  // namespace

uint32_t plugin_max_devices(const eh_plugin_api& api) {
    if (api.abi_minor < 6 || !api.info) return 1;
    const eh_plugin_info* pi = api.info();
    if (!pi || pi->struct_size < offsetof(eh_plugin_info, max_devices) + sizeof(uint32_t)) return 1;
    return pi->max_devices == 0 ? 1 : pi->max_devices;
}

std::shared_ptr<EngineModel> EngineModel::load(std::shared_ptr<const eh_plugin_api> api,
                                               const std::string& path, const eh_model_view* view,
                                               std::shared_ptr<const void> view_owner,
                                               const EngineLoadOptions& options) {
    if (options.devices.size() > 1) {
        const uint32_t most = plugin_max_devices(*api);
        if (options.devices.size() > most) {
            const eh_plugin_info* pi = api->info();
            throw Error(Code::ModelLoadFailed,
                        "plugin " + std::string(pi && pi->name ? pi->name : "(unnamed)") + " serves " +
                            (most == 1 ? std::string("one device only") : "at most " + std::to_string(most) + " devices") +
                            "; " + std::to_string(options.devices.size()) + " were asked for (--tensor-parallel)");
        }
    }
    std::shared_ptr<EngineModel> m(new EngineModel());
    m->api_ = std::move(api);
    m->view_owner_ = std::move(view_owner);

    auto progress = options.progress;
    auto cancel = options.cancel;
    eh_load_params p{};
    p.struct_size = sizeof(p);
    p.path = path.c_str();
    p.view = view;
    p.device = options.devices.empty() ? options.device : options.devices[0];
    if (!options.devices.empty()) {
        p.n_devices = uint32_t(options.devices.size());
        p.devices = options.devices.data();
    }
    p.n_threads = options.n_threads;
    p.options_json = options.options_json.empty() ? nullptr : options.options_json.c_str();
    if (progress) {
        p.progress = &progress_thunk;
        p.progress_user = &progress;
    }
    if (cancel) {
        p.cancel = &cancel_thunk;
        p.cancel_user = &cancel;
    }
    eh_model* raw = nullptr;
    eh_status st = call([&] { return m->api_->model_load(&p, &raw); });
    if (st != EH_OK) {
        if (raw) m->api_->model_release(raw);  // a contract breach, but do not leak
        throw Error(code_from_status(st),
                    message_or(m->api_->plugin_last_error(), eh_status_name(st)));
    }
    if (!raw) throw Error(Code::Internal, "plugin returned OK from model_load but no model");
    m->model_ = raw;
    return m;
}

EngineModel::~EngineModel() {
    if (model_) {
        try {
            api_->model_release(model_);
        } catch (...) {
        }
    }
}

eh_model_info EngineModel::info() const {
    eh_model_info info{};
    info.struct_size = sizeof(info);
    eh_status st = call([&] { return api_->model_get_info(model_, &info); });
    if (st != EH_OK) throw Error(code_from_status(st), message_or(api_->model_last_error(model_), "model_get_info failed"));
    info.architecture[sizeof(info.architecture) - 1] = '\0';
    info.quant_kind[sizeof(info.quant_kind) - 1] = '\0';
    info.device_name[sizeof(info.device_name) - 1] = '\0';
    return info;
}

bool EngineModel::check_residency(std::string* why) const {
    int32_t resident = 0;
    eh_status st = call([&] { return api_->model_check_residency(model_, &resident); });
    if (st != EH_OK || !resident) {
        if (why) *why = message_or(api_->model_last_error(model_), st != EH_OK ? eh_status_name(st) : "not resident");
        return false;
    }
    return true;
}

std::unique_ptr<EngineSession> EngineModel::create_session(uint32_t n_ctx, std::function<bool()> cancel) {
    if (!api_->session_create)
        throw Error(Code::InvalidRequest,
                    "the plugin has no session calls (ABI 1.4, step only): run it through the batched step "
                    "(bench: --path step)");
    std::unique_ptr<EngineSession> s(new EngineSession());
    s->model_ = shared_from_this();
    eh_session_params p{};
    p.struct_size = sizeof(p);
    p.n_ctx = n_ctx;
    if (cancel) {
        s->cancel_ = std::make_unique<std::function<bool()>>(std::move(cancel));
        p.cancel = &cancel_thunk;
        p.cancel_user = s->cancel_.get();
    }
    eh_status st = call([&] { return api_->session_create(model_, &p, &s->session_); });
    if (st != EH_OK) {
        s->session_ = nullptr;
        throw Error(code_from_status(st), message_or(api_->model_last_error(model_), "session_create failed"));
    }
    return s;
}

EngineSession::~EngineSession() {
    if (session_) {
        try {
            model_->api_->session_release(session_);
        } catch (...) {
        }
    }
}

void EngineSession::fail(eh_status st, const char* what) const {
    throw Error(code_from_status(st), message_or(model_->api_->session_last_error(session_), what));
}

void EngineSession::set_sampling(const eh_sampling_params& params) {
    eh_sampling_params p = params;
    p.struct_size = sizeof(p);
    eh_status st = call([&] { return model_->api_->session_set_sampling(session_, &p); });
    if (st != EH_OK) fail(st, "session_set_sampling failed");
}

void EngineSession::prefill(std::span<const int32_t> tokens) {
    eh_status st = call([&] {
        return model_->api_->session_prefill(session_, tokens.data(), static_cast<uint32_t>(tokens.size()));
    });
    if (st != EH_OK) fail(st, "session_prefill failed");
}

int32_t EngineSession::sample() {
    int32_t tok = -1;
    eh_status st = call([&] { return model_->api_->session_sample(session_, &tok); });
    if (st != EH_OK) fail(st, "session_sample failed");
    return tok;
}

int32_t EngineSession::decode(int32_t token) {
    int32_t next = -1;
    eh_status st = call([&] { return model_->api_->session_decode(session_, token, &next); });
    if (st != EH_OK) fail(st, "session_decode failed");
    return next;
}

void EngineSession::reset() {
    eh_status st = call([&] { return model_->api_->session_reset(session_); });
    if (st != EH_OK) fail(st, "session_reset failed");
}

uint32_t EngineSession::n_past() const { return model_->api_->session_n_past(session_); }

bool EngineSession::has_logits() const { return model_->api_->session_logits != nullptr; }

std::span<const float> EngineSession::logits() {
    if (!has_logits()) throw Error(Code::InvalidRequest, "this plugin does not expose logits");
    const float* data = nullptr;
    uint32_t n = 0;
    eh_status st = call([&] { return model_->api_->session_logits(session_, &data, &n); });
    if (st != EH_OK) fail(st, "session_logits failed");
    return {data, n};
}

}  // namespace eh
