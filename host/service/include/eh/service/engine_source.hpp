// Where the service's engine comes from: a model loaded by a plugin in this
// process, or an engine process (remote_engine.hpp) that loaded it. The
// service reads the model's facts and builds its SeqEngine through this, the
// same way for both.
#pragma once

#include <memory>
#include <string>

#include <engine_host/plugin_abi.h>

#include "eh/loader/engine.hpp"
#include "eh/service/seq_engine.hpp"

namespace eh::service {

struct EngineFacts {
    eh_model_info info{};           // device_bytes_used: as of the last look
    std::string plugin_name, plugin_version;
    bool logits = false;            // the engine gives raw logits (logprobs): seq_logits, or session_logits without the batched step
    bool hidden = false;            // the engine gives final hidden states (embeddings, rerank): ABI 1.5 seq_hidden
};

class EngineSource {
public:
    virtual ~EngineSource() = default;
    virtual EngineFacts facts() const = 0;
    // Once, before serving (kv_init for batched plugins). Throws eh::Error.
    virtual std::unique_ptr<SeqEngine> make_engine(const KvBudget& budget) = 0;
    // True when every weight is resident; otherwise false and `why` says why.
    virtual bool check_residency(std::string* why) = 0;
};

// A model this process loaded, with the LoRA adapters loaded into it
// (lora.hpp); the engine it makes holds them.
std::shared_ptr<EngineSource> local_engine(std::shared_ptr<EngineModel> model,
                                           std::vector<std::shared_ptr<EngineAdapter>> adapters = {});

}  // namespace eh::service
