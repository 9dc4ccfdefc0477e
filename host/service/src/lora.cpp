#include "eh/service/lora.hpp"

#include <fmt/format.h>

#include "eh/loader/plugin_loader.hpp"
#include "eh/service/utf8.hpp"

namespace eh::service {

bool valid_adapter_name(std::string_view name) {
    if (name.empty() || name.size() > 64) return false;
    for (char c : name)
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-'))
            return false;
    return true;
}

std::shared_ptr<EngineAdapter> EngineAdapter::load(std::shared_ptr<EngineModel> model, const std::string& name,
                                                   const eh_model_view* view, std::shared_ptr<const void> view_owner,
                                                   float scale, float alpha) {
    const eh_plugin_api& api = model->api();
    if (!loader::api_has_adapters(api)) {
        const eh_plugin_info* pi = api.info();
        throw Error(Code::ModelLoadFailed,
                    fmt::format("LoRA adapter '{}': the plugin {} does not serve LoRA adapters (ABI 1.6 adapter_load); "
                                "the cpu-reference, llama-cuda and gpt-cuda plugins do",
                                name, pi && pi->name ? pi->name : "?"));
    }
    eh_adapter_params p{};
    p.struct_size = sizeof(p);
    p.view = view;
    p.scale = scale;
    p.alpha = alpha;
    eh_adapter* raw = nullptr;
    eh_status st;
    try {
        st = api.adapter_load(model->raw(), &p, &raw);
    } catch (...) {
        st = EH_INTERNAL;  // a plugin that lets an exception escape is buggy
    }
    if (st != EH_OK || !raw) {
        const char* msg = api.model_last_error(model->raw());
        throw Error(Code::ModelLoadFailed, fmt::format("LoRA adapter '{}': {}", name,
                                                       msg && *msg ? msg : eh_status_name(st)));
    }
    std::shared_ptr<EngineAdapter> a(new EngineAdapter());
    a->model_ = std::move(model);
    a->view_owner_ = std::move(view_owner);
    a->adapter_ = raw;
    a->name_ = name;
    return a;
}

EngineAdapter::~EngineAdapter() {
    if (adapter_) model_->api().adapter_release(adapter_);
}

namespace {

std::string not_found_message(const std::string& name, const std::vector<std::string>& served) {
    std::string list;
    for (size_t i = 0; i < served.size() && i < 20; ++i) list += (i ? ", '" : "'") + served[i] + "'";
    if (served.size() > 20) list += ", ...";
    return fmt::format("the LoRA adapter '{}' is not served here ({})", sanitize_utf8(name.substr(0, 200)),
                       served.empty() ? std::string("this server has no adapters; start it with --lora NAME=FILE")
                                      : "served: " + list);
}

}  // namespace

AdapterNotFound::AdapterNotFound(std::string name, const std::vector<std::string>& served)
    : Error(Code::NotFound, not_found_message(name, served)), name_(std::move(name)) {}

}  // namespace eh::service
