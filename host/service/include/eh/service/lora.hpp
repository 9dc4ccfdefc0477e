// LoRA adapters in the service: an adapter loaded into a plugin's model (ABI
// 1.6 adapter_load), the names a request may choose one by, and the error a
// request naming an adapter that is not served gets.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <engine_host/plugin_abi.h>

#include "eh/error.hpp"
#include "eh/loader/engine.hpp"

namespace eh::service {

// Most adapters one server loads (--lora).
inline constexpr size_t kMaxAdapters = 64;

// 1-64 bytes of letters, digits, '.', '_' and '-': safe in a `model` of
// the form "<model>:<adapter>", in logs and in metric labels.
bool valid_adapter_name(std::string_view name);

// One adapter loaded into a plugin's model. It keeps the model (and the
// adapter's view) alive and releases the plugin's object once; whoever
// drives sequences releases those that use it first (the SeqEngine holds
// its adapters and releases its sequences before them).
class EngineAdapter {
public:
    // Throws Error(ModelLoadFailed) with the plugin's message, naming the
    // adapter; a plugin without the 1.6 adapter calls is refused by name.
    static std::shared_ptr<EngineAdapter> load(std::shared_ptr<EngineModel> model, const std::string& name,
                                               const eh_model_view* view, std::shared_ptr<const void> view_owner,
                                               float scale, float alpha);
    ~EngineAdapter();
    EngineAdapter(const EngineAdapter&) = delete;
    EngineAdapter& operator=(const EngineAdapter&) = delete;

    eh_adapter* raw() const { return adapter_; }
    const std::string& name() const { return name_; }

private:
    EngineAdapter() = default;
    std::shared_ptr<EngineModel> model_;
    std::shared_ptr<const void> view_owner_;
    eh_adapter* adapter_ = nullptr;
    std::string name_;
};

// A request chose an adapter the server does not serve: HTTP 404
// ADAPTER_NOT_FOUND.
class AdapterNotFound : public Error {
public:
    AdapterNotFound(std::string name, const std::vector<std::string>& served);
    const std::string& adapter() const { return name_; }

private:
    std::string name_;
};

}  // namespace eh::service
