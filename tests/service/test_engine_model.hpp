// The service tests' engine: a fixture build of the deterministic test
// engine (tests/plugins/test-engine), loaded over a minimal llama model view,
// and a job's events until its terminal one.
#pragma once

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "eh/loader/engine.hpp"
#include "eh/loader/plugin_loader.hpp"
#include "eh/service/job.hpp"

namespace eh::test {

// The accepted record of test-plugins/<fixture>.manifest.json (e.g.
// "good/test-engine"); throws when the loader rejects it.
inline PluginRecord load_test_plugin(const std::string& fixture) {
    PluginRecord r = loader::load_plugin(std::string(EH_TEST_PLUGIN_DIR) + "/" + fixture + ".manifest.json",
                                         loader::LoaderOptions{});
    if (!r.accepted) throw std::runtime_error("test plugin " + fixture + " rejected");
    return r;
}

// A model of `api` over an empty llama view (the test engine reads no tensor).
inline std::shared_ptr<EngineModel> load_test_model(std::shared_ptr<const eh_plugin_api> api) {
    static eh_model_view view{};
    view.struct_size = sizeof(view);
    view.format = EH_FORMAT_GGUF;
    view.architecture = {"llama", 5};
    return EngineModel::load(std::move(api), "/dev/null", &view, nullptr, {});
}

// The job's events up to its End or Error (at most 30 s).
inline std::vector<service::JobEvent> drain(service::Job& job) {
    std::vector<service::JobEvent> out;
    for (int i = 0; i < 600; ++i) {
        auto ev = job.pop(std::chrono::milliseconds(50));
        if (!ev) continue;
        out.push_back(*ev);
        if (ev->kind == service::JobEvent::Kind::End || ev->kind == service::JobEvent::Kind::Error) break;
    }
    return out;
}

}  // namespace eh::test
