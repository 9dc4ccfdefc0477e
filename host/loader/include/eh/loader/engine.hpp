// C++ handles over a plugin's model and session objects. They own the ABI
// objects (release exactly once, sessions before their model, library kept
// loaded while any lives) and turn every failed call into eh::Error carrying
// the plugin's own message.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.h>

namespace eh {

// How many devices one load of this plugin may span (ABI 1.6
// eh_plugin_info.max_devices): 1 for a plugin before 1.6, one whose info
// ends before the member, or one that says 0.
uint32_t plugin_max_devices(const eh_plugin_api& api);

struct EngineLoadOptions {
    int32_t device = 0;
    // (1.6) the devices the load spans, rank i on devices[i]; empty: `device`
    // alone. More than one needs a plugin whose max_devices allows them
    // (plugin_max_devices); load() refuses the rest by name.
    std::vector<int32_t> devices;
    uint32_t n_threads = 0;
    std::string options_json;                          // plugin-specific, may be empty
    std::function<void(float, const char*)> progress;  // may be empty
    std::function<bool()> cancel;                      // may be empty
};

class EngineSession;

class EngineModel : public std::enable_shared_from_this<EngineModel> {
public:
    // `view_owner` keeps the model view (and the mapping behind it) alive for
    // as long as the plugin's model object exists.
    static std::shared_ptr<EngineModel> load(std::shared_ptr<const eh_plugin_api> api,
                                             const std::string& path, const eh_model_view* view,
                                             std::shared_ptr<const void> view_owner,
                                             const EngineLoadOptions& options);
    ~EngineModel();
    EngineModel(const EngineModel&) = delete;
    EngineModel& operator=(const EngineModel&) = delete;

    eh_model_info info() const;
    // True when every weight is resident; otherwise false and `why` says why.
    bool check_residency(std::string* why) const;

    std::unique_ptr<EngineSession> create_session(uint32_t n_ctx, std::function<bool()> cancel = {});

    const eh_plugin_api& api() const { return *api_; }
    // Keeps `p` alive until after model_release (a second view the plugin
    // may point into: an image encoder's file, ABI 1.6).
    void keep_alive(std::shared_ptr<const void> p) { keep_.push_back(std::move(p)); }
    eh_model* raw() const { return model_; }

private:
    EngineModel() = default;
    std::shared_ptr<const eh_plugin_api> api_;
    std::shared_ptr<const void> view_owner_;
    std::vector<std::shared_ptr<const void>> keep_;  // released after the model (the destructor's body)
    eh_model* model_ = nullptr;
    friend class EngineSession;
};

class EngineSession {
public:
    ~EngineSession();
    EngineSession(const EngineSession&) = delete;
    EngineSession& operator=(const EngineSession&) = delete;

    void set_sampling(const eh_sampling_params& params);
    void prefill(std::span<const int32_t> tokens);
    int32_t sample();
    int32_t decode(int32_t token);
    void reset();
    uint32_t n_past() const;
    bool has_logits() const;
    std::span<const float> logits();  // from the last sampled position

private:
    friend class EngineModel;
    EngineSession() = default;
    [[noreturn]] void fail(eh_status st, const char* what) const;
    std::shared_ptr<EngineModel> model_;
    eh_session* session_ = nullptr;
    std::unique_ptr<std::function<bool()>> cancel_;  // stable address for the C callback
};

}  // namespace eh
