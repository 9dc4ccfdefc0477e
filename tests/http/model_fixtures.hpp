// Models for server tests: a GGUF re-written with some metadata replaced (in
// a temp file removed with the object) — stories260K with a model family's
// real chat template, or a vocabulary-only GGUF the test engine can serve —
// and a host whose test engine writes a given text.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "eh/model/gguf_writer.hpp"
#include "eh/model/model_file.hpp"
#include "eh/tools/vocab.hpp"
#include "engine_host_process.hpp"

namespace eh::test {

struct RewrittenModel {
    std::string path;
    RewrittenModel(const std::string& source, const std::map<std::string, eh::model::GgufValue>& replace) {
        static int n = 0;
        path = (std::filesystem::temp_directory_path() /
                ("eh-rewritten-" + std::to_string(::getpid()) + "-" + std::to_string(++n) + ".gguf"))
                   .string();
        auto mf = eh::model::ModelFile::open(source);
        eh::model::GgufWriter w;
        for (const auto& kv : mf->metadata()) {
            std::string key(eh::model::to_sv(kv.key));
            if (replace.count(key) || key == "general.alignment") continue;
            w.set(key, eh::tools::to_gguf_value(kv.value));
        }
        for (const auto& [k, v] : replace) w.set(k, v);
        for (const eh_tensor& t : mf->tensors())
            w.add_tensor(std::string(eh::model::to_sv(t.name)), t.type, std::vector<uint64_t>(t.dims, t.dims + t.n_dims),
                         t.data);
        w.write(path);
    }
    ~RewrittenModel() { std::filesystem::remove(path); }
    RewrittenModel(const RewrittenModel&) = delete;
    RewrittenModel& operator=(const RewrittenModel&) = delete;
};

// `source` (stories260K by default) with `tmpl` as its tokenizer.chat_template.
struct TemplatedModel : RewrittenModel {
    explicit TemplatedModel(const std::string& tmpl, const std::string& source = stories_model())
        : RewrittenModel(source, {{"tokenizer.chat_template", eh::model::GgufValue::string(tmpl)}}) {}
};

// engine-host serving `model` with the test engine scripted
// (EH_TEST_ENGINE_SCRIPT) to write `text`, then EOS, for every request. The
// ids come from the model's own tokenizer (a first host's /tokenize).
struct ScriptedHost {
    std::unique_ptr<EngineHost> host;
    ScriptedHost(const std::string& model, const std::string& text, std::vector<std::string> args = {}) {
        std::string ids;
        {
            EngineHost tok({}, {}, true, std::string(EH_TEST_PLUGIN_DIR) + "/good", model);
            auto r = tok.post("/tokenize", nlohmann::json{{"text", text}, {"add_special", false}}.dump());
            const nlohmann::json tokens = nlohmann::json::parse(r.body, nullptr, false)["tokens"];
            for (int id : tokens) ids += (ids.empty() ? "" : ",") + std::to_string(id);
        }
        host = std::make_unique<EngineHost>(args, std::map<std::string, std::string>{{"EH_TEST_ENGINE_SCRIPT", ids}}, true,
                                            std::string(EH_TEST_PLUGIN_DIR) + "/good", model);
    }
    EngineHost& operator*() { return *host; }
    EngineHost* operator->() { return host.get(); }
};

}  // namespace eh::test
