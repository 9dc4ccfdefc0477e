// `engine-host serve`'s flags, read into checked settings.
#include "serve_settings.hpp"

#include <boost/algorithm/string.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>
#include <random>
#include <regex>

#include "eh/loader/plugin_search.hpp"
#include "gpu_set.hpp"
#include "kv_cache_option.hpp"
#include "spec_option.hpp"
#include "model_ref.hpp"
#include "serve_access.hpp"
#include "serve_model.hpp"

namespace eh::cli {
namespace {

// --kv-host-bytes' ceiling: far above a host's memory, far below overflow.
constexpr uint64_t kMaxKvHostBytes = uint64_t(1) << 40;

std::string new_uuid() {
    std::mt19937_64 rng{std::random_device{}()};
    uint64_t a = rng(), b = rng();
    a = (a & ~0xF000ull) | 0x4000ull;                        // version 4
    b = (b & ~(0xC000ull << 48)) | (0x8000ull << 48);         // RFC 4122 variant
    return fmt::format("{:08x}-{:04x}-{:04x}-{:04x}-{:012x}", uint32_t(a >> 32), uint16_t(a >> 16), uint16_t(a),
                       uint16_t(b >> 48), b & 0xFFFFFFFFFFFFull);
}

// The model's id, and the further names (--served-model-name, the file's
// name) a request's `model` may use.
bool read_model_names(const po::variables_map& vm, ServedModelSpec& m, std::string& err) {
    const std::vector<std::string> served_names =
        vm.count("served-model-name") ? vm["served-model-name"].as<std::vector<std::string>>() : std::vector<std::string>{};
    for (const auto& n : served_names) {
        bool ok = !n.empty() && n.size() <= 256;
        for (unsigned char c : n) ok = ok && c >= 0x20 && c != 0x7f;
        if (!ok) {
            err = "--served-model-name must be 1-256 bytes without control characters";
            return false;
        }
    }
    m.name = vm.count("model-name") ? vm["model-name"].as<std::string>()
             : !served_names.empty() ? served_names.front()
                                     : model_id(m.path);
    for (const auto& n : served_names)
        if (n != m.name && std::find(m.aliases.begin(), m.aliases.end(), n) == m.aliases.end())
            m.aliases.push_back(n);
    if (const std::string file_name = model_id(m.path); !served_names.empty() && file_name != m.name &&
        std::find(m.aliases.begin(), m.aliases.end(), file_name) == m.aliases.end())
        m.aliases.push_back(file_name);
    m.refuse_unknown = !served_names.empty();
    return true;
}

bool name_ok(const std::string& n) {
    bool ok = !n.empty() && n.size() <= 256;
    for (unsigned char c : n) ok = ok && c >= 0x20 && c != 0x7f;
    return ok;
}

// NAME=REF: a name (no '/') before the first '=', and not a file that exists as written.
std::optional<std::pair<std::string, std::string>> named_ref(const std::string& arg) {
    const size_t eq = arg.find('=');
    if (eq == std::string::npos || eq == 0 || arg.find('/') < eq) return std::nullopt;
    std::error_code ec;
    if (std::filesystem::exists(arg, ec)) return std::nullopt;
    return std::make_pair(arg.substr(0, eq), arg.substr(eq + 1));
}

// Several --model, --model NAME=REF, --models-dir: the models a pool
// serves, each with its names; --served-model-name NAME=ALIAS adds aliases.
bool read_many_models(const po::variables_map& vm, const std::vector<std::string>& refs, ServeSettings& s,
                      std::string& err) {
    const bool offline = vm.count("offline") > 0;
    for (const auto& arg : refs) {
        ServedModelSpec m;
        if (auto named = named_ref(arg)) {
            m.name = named->first;
            m.ref = named->second;
        } else {
            m.ref = arg;
        }
        m.path = resolve_model_ref(m.ref, offline);
        if (m.name.empty()) m.name = model_id(m.path);
        s.models.push_back(std::move(m));
    }
    if (vm.count("models-dir")) {
        const std::string dir = vm["models-dir"].as<std::string>();
        std::error_code ec;
        if (!std::filesystem::is_directory(dir, ec)) {
            err = "--models-dir " + dir + ": not a directory";
            return false;
        }
        std::vector<std::filesystem::path> found;
        for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
            const auto& p = e.path();
            if ((e.is_regular_file(ec) && p.extension() == ".gguf") ||
                (e.is_directory(ec) && std::filesystem::exists(p / "config.json", ec)))
                found.push_back(p);
        }
        std::sort(found.begin(), found.end());
        if (found.empty()) {
            err = "--models-dir " + dir + " holds no GGUF file and no Hugging Face model directory";
            return false;
        }
        for (const auto& p : found) {
            ServedModelSpec m;
            m.ref = m.path = p.string();
            m.name = model_id(m.path);
            s.models.push_back(std::move(m));
        }
    }
    if (vm.count("model-name")) {
        err = "--model-name names the one model; with many, name each with --model NAME=PATH";
        return false;
    }
    if (vm.count("served-model-name"))
        for (const auto& a : vm["served-model-name"].as<std::vector<std::string>>()) {
            const size_t eq = a.find('=');
            auto it = eq == std::string::npos ? s.models.end()
                                              : std::find_if(s.models.begin(), s.models.end(),
                                                             [&](const ServedModelSpec& m) { return m.name == a.substr(0, eq); });
            if (it == s.models.end()) {
                err = "with many models, --served-model-name takes MODEL=ALIAS naming one of them (got '" + a + "')";
                return false;
            }
            it->aliases.push_back(a.substr(eq + 1));
        }
    std::set<std::string> names;
    for (auto& m : s.models) {
        m.refuse_unknown = true;
        std::vector<const std::string*> all{&m.name};
        for (const auto& a : m.aliases) all.push_back(&a);
        for (const auto* n : all) {
            if (!name_ok(*n)) {
                err = "a model name must be 1-256 bytes without control characters (got '" + *n + "')";
                return false;
            }
            if (!names.insert(*n).second) {
                err = "the model name '" + *n + "' is given to two models (name them with --model NAME=PATH)";
                return false;
            }
        }
    }
    // Each reports on the one model (its blocks, its load, its file's digest).
    for (const char* flag : {"kv-events-endpoint", "callback-url", "artifacts-dir"})
        if (vm.count(flag)) {
            err = std::string("--") + flag +
                  " reports on one model (a plain --model PATH); it cannot go with --model NAME=PATH, several "
                  "--model or --models-dir";
            return false;
        }
    s.model = s.models.front();
    s.models_memory_mb = vm["models-memory-mb"].as<double>();
    if (!(s.models_memory_mb >= 0 && s.models_memory_mb <= 1e9)) {
        err = "--models-memory-mb must be between 0 and 1e9";
        return false;
    }
    s.idle_unload_seconds = vm["idle-unload-seconds"].as<uint32_t>();
    s.model_load_wait_sec = vm["model-load-wait-sec"].as<uint32_t>();
    if (s.model_load_wait_sec < 1 || s.model_load_wait_sec > 3600) {
        err = "--model-load-wait-sec must be between 1 and 3600";
        return false;
    }
    return true;
}

bool read_kv_events(const po::variables_map& vm, ServeSettings& s, std::string& err) {
    if (vm.count("kv-events-endpoint")) {
        if (vm.count("no-prefix-cache")) {
            err = "--kv-events-endpoint announces the prefix cache's blocks: it cannot go with --no-prefix-cache";
            return false;
        }
        if (vm.count("kv-events-block-tokens") &&
            (vm["kv-events-block-tokens"].as<uint32_t>() < 1 || vm["kv-events-block-tokens"].as<uint32_t>() > 65536)) {
            err = "--kv-events-block-tokens must be between 1 and 65536";
            return false;
        }
    } else if (vm.count("kv-events-replay-endpoint") || vm.count("kv-events-topic") || vm.count("kv-events-block-tokens")) {
        err = "--kv-events-replay-endpoint, --kv-events-topic and --kv-events-block-tokens need --kv-events-endpoint";
        return false;
    }
    if (vm.count("kv-events-endpoint")) s.kv_events_endpoint = vm["kv-events-endpoint"].as<std::string>();
    if (vm.count("kv-events-replay-endpoint")) s.kv_events_replay_endpoint = vm["kv-events-replay-endpoint"].as<std::string>();
    if (vm.count("kv-events-topic")) s.kv_events_topic = vm["kv-events-topic"].as<std::string>();
    if (vm.count("kv-events-block-tokens")) s.kv_events_block_tokens = vm["kv-events-block-tokens"].as<uint32_t>();
    s.kv_events_hash_seed = vm["kv-events-hash-seed"].as<std::string>();
    return true;
}

}  // namespace

void add_serve_options(po::options_description& desc) {
    desc.add_options()
        ("help,h", "show this help")
        ("plugins", po::value<std::vector<std::string>>(), kPluginsHelp)
        ("model,m", po::value<std::vector<std::string>>(),
         "model: a GGUF file, a Hugging Face model directory, hf://ORG/REPO/FILE or ORG/REPO[:QUANT] (pulled into the "
         "hub cache). NAME=REF names it; repeated, the server serves each (loaded on first use, the first is the "
         "default)")
        ("models-dir", po::value<std::string>(),
         "serve every GGUF file and Hugging Face model directory in DIR, named by file name without .gguf "
         "(loaded on first use)")
        ("models-memory-mb", po::value<double>()->default_value(0),
         "with many models: memory (MiB, fractions allowed) the loaded models may hold; past it the least recently "
         "used are unloaded (0 = no budget)")
        ("idle-unload-seconds", po::value<uint32_t>()->default_value(0),
         "with many models: unload a model no request used for this long (0 = never)")
        ("model-load-wait-sec", po::value<uint32_t>()->default_value(60),
         "with many models: how long a request waits for its model to load before it gets 503 MODEL_LOADING (1-3600)")
        ("offline", kOfflineHelp)
        ("model-name", po::value<std::string>(), "model id clients use (default: file name without .gguf)")
        ("served-model-name", po::value<std::vector<std::string>>()->composing(),
         "a name clients may send as `model` (repeatable; the first is the model's id unless --model-name is given); "
         "with it, a request naming any other model gets 404")
        ("chat-template-file", po::value<std::string>(), kChatTemplateFileHelp)
        ("port", po::value<int>()->default_value(8080), "TCP port (0 = any free port)")
        ("host", po::value<std::string>()->default_value("127.0.0.1"), "address to bind")
        ("worker-id", po::value<std::string>(), "UUID of this worker (generated when absent)")
        ("gpu-device", po::value<int>()->default_value(0), kGpuHelp)
        ("tensor-parallel", po::value<uint32_t>()->default_value(1), kTensorParallelHelp)
        ("gpus", po::value<std::string>(), kGpusHelp)
        ("device", po::value<std::string>()->default_value("auto"), kDeviceHelp)
        ("max-tokens-out", po::value<uint32_t>()->default_value(0), "most tokens one request may generate (0 = as many as the context leaves)")
        ("inference-timeout-sec", po::value<uint32_t>()->default_value(300), "per-request time limit")
        ("ctx-size", po::value<uint32_t>()->default_value(0), "context length (prompt + output); default: the model's")
        ("kv-cache-size-mb", po::value<uint64_t>()->default_value(0), "KV-cache pool shared by all sequences (default: --gpu-memory-fraction); without --ctx-size the context is capped to what it holds")
        ("kv-cache-type", po::value<std::string>(), kKvCacheTypeHelp)
        ("kv-host-bytes", po::value<uint64_t>()->default_value(0),
         "host memory (bytes, at most 1 TiB) the prefix cache parks evicted prefixes in, to copy them back instead "
         "of recomputing them (0 = off; needs a plugin with ABI 1.7 seq_park)")
        ("gpu-memory-fraction", po::value<float>()->default_value(0), "KV-cache pool as a fraction (0-1] of the device memory free after the weights (0 = plugin default)")
        ("parallel", po::value<uint32_t>()->default_value(64), "requests decoding at once in the batch (1-4096)")
        ("batch-tokens", po::value<uint32_t>()->default_value(2048), "tokens per forward step: decodes plus prefill chunks (16-65536)")
        ("prefill-chunk-tokens", po::value<uint32_t>()->default_value(512),
         "prefill tokens a step may hold while requests decode, so each decode waits behind at most this much "
         "prompt; with none decoding prefill fills --batch-tokens (16-65536)")
        ("no-prefix-cache", "do not keep finished sequences for prompts that share their prefix")
        ("prefix-cache-shared", "with --api-key: let a request reuse prefixes that requests of other API keys "
                                "computed (single tenant; by default each key reuses only its own)")
        ("no-chained-steps", "read every step's tokens before the next step starts (engines with ABI 1.3's "
                             "step_begin otherwise run the next step while the host streams this one's)")
        ("queue-size", po::value<size_t>()->default_value(256), "requests that may wait for a place in the batch")
        ("embedding", "serve /v1/embeddings (the last token's hidden state, L2-normalised) instead of text; default when the model's GGUF pooling type is last")
        ("rerank", "serve /v1/rerank (a yes/no reranker such as Qwen3-Reranker) instead of text; default when the model's GGUF pooling type is rank")
        ("threads", po::value<uint32_t>()->default_value(0), "CPU threads for CPU engines (0 = plugin default)")
        ("engine-process", "run the engine plugin in a child process: a crash or hang there ends only the requests it was running, and the engine is restarted (docs/robustness.md)")
        ("mmproj", po::value<std::string>(), "the model's multimodal projector GGUF (llama.cpp's convert_hf_to_gguf.py --mmproj): chat requests may then hold images (gemma3 and qwen2vl, with the llama-cuda or cpu-reference plugin; docs/http-api.md)")
        ("engine-options", po::value<std::string>()->default_value(""), "JSON object handed to the engine plugin's model load, e.g. '{\"fp16_weights\":\"off\"}' (each plugin's README lists its keys)")
        ("callback-url", po::value<std::string>(), "POST {worker_id, model_ref, vram_bytes, uri} here once serving")
        ("cors", "allow cross-origin requests from localhost origins (browser tooling)")
        ("allowed-hosts", po::value<std::string>(), "comma-separated Host names accepted besides IPs, localhost and --host (* = any)")
        ("allow-shutdown-endpoint", "enable POST /shutdown")
        ("artifacts-dir", po::value<std::string>(), "write one JSON record per /execute job (request, result, SSE transcript) into DIR; off by default")
        ("responses-max", po::value<uint32_t>()->default_value(1000), "finished Responses API responses kept for previous_response_id and GET /v1/responses/{id} (0-1000000; 0 keeps none); the least recently used go first")
        ("responses-max-mb", po::value<uint32_t>()->default_value(64), "memory those responses may hold, in MiB (1-65536)")
        ("artifacts-max-files", po::value<uint32_t>()->default_value(1000), "records kept in --artifacts-dir (1-1000000); the oldest are removed")
        ("log-format", po::value<std::string>()->default_value("json"), "json or text")
        ("log-level", po::value<std::string>()->default_value("info"), "trace, debug, info, warn, error")
        ("log-content", "log prompts and generated text (off by default)")
        ("residency-check-sec", po::value<uint32_t>()->default_value(30), "how often weights residency is verified")
        ("kv-events-endpoint", po::value<std::string>(), "publish the prefix cache's KV events (vLLM's ZeroMQ format) on this PUB endpoint: tcp://*:5557 binds, tcp://HOST:PORT connects (off by default)")
        ("kv-events-replay-endpoint", po::value<std::string>(), "with --kv-events-endpoint: a ROUTER endpoint (bound) that replays kept event batches from a sequence number")
        ("kv-events-topic", po::value<std::string>(), "the events' topic (default kv@<host>:<port>@<model>)")
        ("kv-events-block-tokens", po::value<uint32_t>(), "tokens per announced block (1-65536; default the engine's KV block, 16 for the bundled plugins); a router's block size must match")
        ("kv-events-hash-seed", po::value<std::string>()->default_value(""), "seed of the block hash chain (llm-d's hashSeed, vLLM's PYTHONHASHSEED)")
        ("shutdown-grace-ms", po::value<uint32_t>()->default_value(4500), "time running jobs get to finish on shutdown; streams then get 500 ms to send their last event");
    add_spec_options(desc);
    add_lora_options(desc);
}

namespace {

// `--flag`'s value into `out` when it lies in [lo, hi]; else the usage error.
template <class T>
bool read_between(const po::variables_map& vm, const char* flag, T lo, T hi, T& out, std::string& err) {
    out = vm[flag].as<T>();
    if (out >= lo && out <= hi) return true;
    err = fmt::format("--{} must be between {} and {}", flag, lo, hi);
    return false;
}

// Runs `read`; an Error it throws becomes the usage error.
template <class F>
bool without_error(std::string& err, F&& read) {
    try {
        read();
        return true;
    } catch (const Error& e) {
        err = e.what();
        return false;
    }
}

// --log-format, --log-level, --log-content, --worker-id.
bool read_logging(const po::variables_map& vm, ServeSettings& s, std::string& err) {
    s.log_format = vm["log-format"].as<std::string>();
    if (s.log_format != "json" && s.log_format != "text") {
        err = "--log-format must be json or text";
        return false;
    }
    s.log_level_name = vm["log-level"].as<std::string>();
    s.log_level = spdlog::level::from_str(s.log_level_name);
    if (s.log_level == spdlog::level::off && s.log_level_name != "off") {
        err = "--log-level must be trace, debug, info, warn, error or off";
        return false;
    }
    s.log_content = vm.count("log-content") > 0;
    s.worker_id = vm.count("worker-id") ? vm["worker-id"].as<std::string>() : new_uuid();
    static const std::regex uuid_re("^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$");
    if (!std::regex_match(s.worker_id, uuid_re)) {
        err = "--worker-id must be a UUID (e.g. 123e4567-e89b-12d3-a456-426614174000)";
        return false;
    }
    return true;
}

// How much the service runs at once, what the engine is told, and the port.
bool read_engine_limits(const po::variables_map& vm, ServeSettings& s, std::string& err) {
    s.max_tokens_out = vm["max-tokens-out"].as<uint32_t>();
    if (!read_between<uint32_t>(vm, "parallel", 1, 4096, s.parallel, err) ||
        !read_between<uint32_t>(vm, "batch-tokens", 16, 65536, s.batch_tokens, err) ||
        !read_between<uint32_t>(vm, "prefill-chunk-tokens", 16, 65536, s.prefill_chunk_tokens, err))
        return false;
    s.engine_options = vm["engine-options"].as<std::string>();
    if (!s.engine_options.empty()) {
        const nlohmann::json j = nlohmann::json::parse(s.engine_options, nullptr, false);
        if (j.is_discarded() || !j.is_object()) {
            err = "--engine-options must be a JSON object, e.g. '{\"fp16_weights\":\"off\"}'";
            return false;
        }
    }
    s.gpu_memory_fraction = vm["gpu-memory-fraction"].as<float>();
    if (!(s.gpu_memory_fraction >= 0.0f && s.gpu_memory_fraction <= 1.0f)) {
        err = "--gpu-memory-fraction must be in [0, 1] (0 = the plugin's default)";
        return false;
    }
    if (vm["inference-timeout-sec"].as<uint32_t>() == 0) {
        err = "--inference-timeout-sec must be positive";
        return false;
    }
    s.inference_timeout = std::chrono::seconds(vm["inference-timeout-sec"].as<uint32_t>());
    return read_between(vm, "port", 0, 65535, s.port, err);
}

// --gpu-device, --gpus, --tensor-parallel, --device.
bool read_devices(const po::variables_map& vm, ServeSettings& s, std::string& err) {
    s.gpu = vm["gpu-device"].as<int>();
    s.named_gpu = vm["gpu-device"].defaulted() ? std::nullopt : std::optional<int>(s.gpu);
    if (s.gpu < 0) {
        err = "--gpu-device must be 0 or more";
        return false;
    }
    const std::string gpus_text = vm.count("gpus") ? vm["gpus"].as<std::string>() : std::string();
    if (!check_gpu_flags(vm["tensor-parallel"].as<uint32_t>(), !vm["tensor-parallel"].defaulted(),
                         vm.count("gpus") ? &gpus_text : nullptr, s.named_gpu.has_value(), s.tensor_parallel, s.gpus,
                         err))
        return false;
    if (!parse_device_policy(vm["device"].as<std::string>(), s.policy)) {
        err = "--device must be auto, gpu, cpu or any";
        return false;
    }
    return true;
}

// --chat-template-file, then the model or models served (--model,
// --models-dir) and the plugin directories.
bool read_models(const po::variables_map& vm, ServeSettings& s, std::string& err) {
    // Read and compiled before anything starts: a bad file is a usage error.
    if (vm.count("chat-template-file")) {
        s.chat_template_path = vm["chat-template-file"].as<std::string>();
        if (!without_error(err, [&] { s.chat_template = chat_template_from_file(s.chat_template_path); }))
            return false;
    }
    if (!vm.count("model") && !vm.count("models-dir")) {
        err = "the option '--model' is required but missing (try --help)";
        return false;
    }
    const std::vector<std::string> refs =
        vm.count("model") ? vm["model"].as<std::vector<std::string>>() : std::vector<std::string>{};
    s.plugin_dirs = loader::plugin_dirs(plugins_arg(vm));
    if (refs.size() != 1 || vm.count("models-dir") || named_ref(refs[0])) return read_many_models(vm, refs, s, err);
    s.model.ref = refs[0];
    s.model.path = resolve_model_ref(s.model.ref, vm.count("offline") > 0);
    if (!read_model_names(vm, s.model, err)) return false;
    for (const char* flag : {"models-memory-mb", "idle-unload-seconds", "model-load-wait-sec"})
        if (!vm[flag].defaulted()) {
            err = std::string("--") + flag + " is for many models (several --model, --model NAME=PATH or --models-dir)";
            return false;
        }
    return true;
}

// What goes with the one model in this process only: --engine-process
// against tensor parallelism, --draft-model, --lora and --mmproj.
bool read_one_model_extras(const po::variables_map& vm, ServeSettings& s, std::string& err) {
    s.engine_process = vm.count("engine-process") > 0;
    if (s.engine_process && (s.tensor_parallel > 1 || !s.gpus.empty())) {
        err = "--tensor-parallel and --gpus cannot go with --engine-process yet: the engine worker loads on one GPU";
        return false;
    }
    if (s.spec.source == service::SpecSource::DraftModel && s.engine_process) {
        err = "--draft-model cannot go with --engine-process: the draft model runs in this process, beside the scheduler";
        return false;
    }
    if (s.spec.source == service::SpecSource::DraftModel && !s.models.empty()) {
        err = "--draft-model drafts for the one model; it cannot go with --model NAME=PATH, several --model or --models-dir";
        return false;
    }
    if (!read_lora_flags(vm, s.loras, err)) return false;
    if (!s.loras.empty() && s.kv_events_endpoint) {
        err = "--lora cannot go with --kv-events-endpoint: the published block hashes do not carry the adapter";
        return false;
    }
    if (!s.loras.empty() && !s.models.empty()) {
        err = "--lora adapts the one model; it cannot go with --model NAME=PATH, several --model or --models-dir";
        return false;
    }
    if (!vm.count("mmproj")) return true;
    s.mmproj = vm["mmproj"].as<std::string>();
    if (s.engine_process) {
        err = "--mmproj cannot go with --engine-process: the image encoder is loaded into the plugin in this process";
        return false;
    }
    if (!s.models.empty()) {
        err = "--mmproj belongs to the one model; it cannot go with --model NAME=PATH, several --model or --models-dir";
        return false;
    }
    return true;
}

// Threads, context, the KV cache (size, host tier, type), the queue, the
// prefix cache, chained steps.
bool read_kv_and_queue(const po::variables_map& vm, ServeSettings& s, std::string& err) {
    s.threads = vm["threads"].as<uint32_t>();
    s.ctx_size = vm["ctx-size"].as<uint32_t>();
    s.kv_cache_mb = vm["kv-cache-size-mb"].as<uint64_t>();
    s.kv_host_bytes = vm["kv-host-bytes"].as<uint64_t>();
    if (s.kv_host_bytes > kMaxKvHostBytes) {
        err = fmt::format("--kv-host-bytes {} is more than the most, {} (1 TiB)", s.kv_host_bytes, kMaxKvHostBytes);
        return false;
    }
    if (s.kv_host_bytes && vm.count("no-prefix-cache")) {
        err = "--kv-host-bytes parks the prefix cache's entries: it cannot go with --no-prefix-cache";
        return false;
    }
    if (!without_error(err, [&] { s.kv_type = kv_cache_type_arg(vm); })) return false;
    s.queue_size = vm["queue-size"].as<size_t>();
    s.prefix_cache = vm.count("no-prefix-cache") == 0;
    s.prefix_cache_shared = vm.count("prefix-cache-shared") != 0;
    s.chained_steps = vm.count("no-chained-steps") == 0;
    return true;
}

}  // namespace

bool read_serve_settings(const po::variables_map& vm, ServeSettings& s, std::string& err) {
    if (!read_logging(vm, s, err) || !read_engine_limits(vm, s, err) || !read_devices(vm, s, err) ||
        !read_models(vm, s, err) || !read_kv_events(vm, s, err) ||
        !without_error(err, [&] { s.spec = read_spec_options(vm, s.draft_model_path); }) ||
        !read_one_model_extras(vm, s, err) || !read_kv_and_queue(vm, s, err))
        return false;
    if (vm.count("embedding") && vm.count("rerank")) {
        err = "--embedding and --rerank are two modes: pass one";
        return false;
    }
    s.pooling = vm.count("embedding") ? PoolingFlag::Embedding : vm.count("rerank") ? PoolingFlag::Rerank : PoolingFlag::Auto;
    s.shutdown_grace = std::chrono::milliseconds(vm["shutdown-grace-ms"].as<uint32_t>());
    s.residency_check_sec = vm["residency-check-sec"].as<uint32_t>();
    if (vm.count("callback-url")) s.callback_url = vm["callback-url"].as<std::string>();
    return true;
}

bool read_server_options(const po::variables_map& vm, const ServeSettings& s, http::ServerOptions& so, std::string& err) {
    so.host = vm["host"].as<std::string>();
    so.port = s.port;
    so.cors = vm.count("cors") > 0;
    if (vm.count("allowed-hosts")) boost::split(so.allowed_hosts, vm["allowed-hosts"].as<std::string>(), boost::is_any_of(","));
    so.allow_shutdown_endpoint = vm.count("allow-shutdown-endpoint") > 0;
    if (s.max_tokens_out) so.limits.max_tokens = s.max_tokens_out;
    if (!apply_serve_access_options(vm, so, err)) return false;
    // Every running and waiting request holds an HTTP thread while it streams.
    so.threads = s.queue_size + s.parallel + 16;
    so.responses_max = vm["responses-max"].as<uint32_t>();
    so.responses_max_bytes = size_t(vm["responses-max-mb"].as<uint32_t>()) << 20;
    if (so.responses_max > 1000000 || so.responses_max_bytes < (size_t(1) << 20) ||
        so.responses_max_bytes > (size_t(65536) << 20)) {
        err = "--responses-max must be between 0 and 1000000 and --responses-max-mb between 1 and 65536";
        return false;
    }
    if (vm.count("artifacts-dir")) {
        so.artifacts_dir = vm["artifacts-dir"].as<std::string>();
        so.artifacts_max_files = vm["artifacts-max-files"].as<uint32_t>();
        if (so.artifacts_dir.empty() || so.artifacts_max_files < 1 || so.artifacts_max_files > 1000000) {
            err = "--artifacts-dir must name a directory and --artifacts-max-files be between 1 and 1000000";
            return false;
        }
        so.model_ref = s.model.ref;
        so.model_path = s.model.path;
    }
    return true;
}

}  // namespace eh::cli
