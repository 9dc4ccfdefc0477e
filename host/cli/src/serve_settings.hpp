// `engine-host serve`'s flags and what they become: every value is checked
// here, before anything starts, so a bad one is a usage error (exit 2).
#pragma once

#include <spdlog/common.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "chat_template_choice.hpp"
#include "device_choice.hpp"
#include "eh/http/server.hpp"
#include "options.hpp"
#include "serve_lora.hpp"
#include "serve_pooling.hpp"
#include "eh/service/speculation.hpp"

namespace eh::cli {

inline constexpr const char* kServeUsage =
    "Usage: engine-host [serve] --model REF [--plugins DIR] [--port N] [options]";

// The model a server runs and the names a request's `model` may use for it.
struct ServedModelSpec {
    std::string ref;                   // --model as given
    std::string path;                  // the local file or directory it names
    std::string name;                  // its id (--model-name, the first --served-model-name, the file name)
    std::vector<std::string> aliases;  // further names a request may use
    bool refuse_unknown = false;       // --served-model-name given: any other name gets 404
};

struct ServeSettings {
    std::string log_format;  // json | text
    std::string log_level_name;
    spdlog::level::level_enum log_level = spdlog::level::info;
    bool log_content = false;
    std::string worker_id;

    int port = 8080;
    int gpu = 0;
    std::optional<int> named_gpu;  // --gpu-device given on the command line
    // --tensor-parallel / --gpus (gpu_set.hpp): the ranks, and the GPUs
    // named in rank order (empty: chosen by free memory at start)
    uint32_t tensor_parallel = 1;
    std::vector<int> gpus;
    DevicePolicy policy{};
    std::vector<std::string> plugin_dirs;
    bool engine_process = false;
    uint32_t threads = 0;
    std::string engine_options;  // a JSON object, or ""

    std::optional<ChatTemplateChoice> chat_template;  // --chat-template-file, compiled
    std::string chat_template_path;
    ServedModelSpec model;  // the one model, or with many the default (the first)
    // Many models (several --model, --model NAME=PATH or --models-dir): each
    // loads on first use. Empty for one model, loaded at startup.
    std::vector<ServedModelSpec> models;
    double models_memory_mb = 0;       // 0: no budget
    uint32_t idle_unload_seconds = 0;  // 0: never
    uint32_t model_load_wait_sec = 60;

    uint32_t max_tokens_out = 0;
    uint32_t parallel = 64;
    uint32_t batch_tokens = 2048;
    uint32_t prefill_chunk_tokens = 512;
    uint32_t ctx_size = 0;
    uint64_t kv_cache_mb = 0;
    uint64_t kv_host_bytes = 0;  // --kv-host-bytes: the prefix cache's host tier; 0: off
    uint32_t kv_type = 0;  // --kv-cache-type (ABI 1.4 kv_type); 0: the plugin's default
    float gpu_memory_fraction = 0;
    size_t queue_size = 256;
    bool prefix_cache = true, prefix_cache_shared = false, chained_steps = true;
    service::SpecOptions spec;     // --spec-ngram / --draft-model and their settings (spec_option.hpp)
    std::string draft_model_path;  // --draft-model (one model, in this process)
    PoolingFlag pooling = PoolingFlag::Auto;  // --embedding, --rerank
    std::vector<LoraFlag> loras;              // --lora, --lora-scale (one model, in this process)
    std::string mmproj;                       // --mmproj: the model's image encoder (one model, in this process)
    std::chrono::seconds inference_timeout{300};
    std::chrono::milliseconds shutdown_grace{4500};
    uint32_t residency_check_sec = 30;
    std::optional<std::string> callback_url;

    // --kv-events-*: on when `endpoint` is set.
    std::optional<std::string> kv_events_endpoint, kv_events_replay_endpoint, kv_events_topic;
    std::optional<uint32_t> kv_events_block_tokens;
    std::string kv_events_hash_seed;
};

// Every serve flag but the access ones (serve_access.hpp).
void add_serve_options(po::options_description& desc);

// The flags as checked settings; false with `err` set for a bad value. The
// model reference is resolved here (a hub reference is pulled).
bool read_serve_settings(const po::variables_map& vm, ServeSettings& out, std::string& err);

// The HTTP server's options: address, limits, access (serve_access.hpp),
// the Responses store and --artifacts-dir; false with `err` set for a bad value.
bool read_server_options(const po::variables_map& vm, const ServeSettings& s, http::ServerOptions& so, std::string& err);

}  // namespace eh::cli
