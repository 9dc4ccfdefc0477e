// stories260K re-written with another tokenizer.chat_template, in a temp
// file removed with the object: serves a model family's real template (or a
// hostile one) through the test engine.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "eh/model/gguf_writer.hpp"
#include "eh/model/model_file.hpp"
#include "eh/tools/vocab.hpp"
#include "engine_host_process.hpp"

namespace eh::test {

struct TemplatedModel {
    std::string path;
    explicit TemplatedModel(const std::string& tmpl) {
        path = (std::filesystem::temp_directory_path() / ("eh-tmpl-" + std::to_string(::getpid()) + "-" +
                                                           std::to_string(std::hash<std::string>{}(tmpl)) + ".gguf"))
                   .string();
        auto mf = eh::model::ModelFile::open(stories_model());
        eh::model::GgufWriter w;
        for (const auto& kv : mf->metadata()) {
            std::string key(eh::model::to_sv(kv.key));
            if (key == "tokenizer.chat_template" || key == "general.alignment") continue;
            w.set(key, eh::tools::to_gguf_value(kv.value));
        }
        w.set("tokenizer.chat_template", eh::model::GgufValue::string(tmpl));
        for (const eh_tensor& t : mf->tensors())
            w.add_tensor(std::string(eh::model::to_sv(t.name)), t.type, std::vector<uint64_t>(t.dims, t.dims + t.n_dims),
                         t.data);
        w.write(path);
    }
    ~TemplatedModel() { std::filesystem::remove(path); }
};

}  // namespace eh::test
