// Loading the served model and starting its service (serve_engine.hpp).
#include "serve_engine.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "eh/http/last_words.hpp"
#include "eh/loader/plugin_loader.hpp"
#include "eh/model/descriptor.hpp"
#include "eh/model/model_file.hpp"
#include "eh/service/event_log.hpp"
#include "eh/service/kv_cache_type.hpp"
#include "load_progress.hpp"
#include "plugin_report.hpp"
#include "serve_codec.hpp"
#include "serve_lora.hpp"
#include "serve_model.hpp"
#include "serve_placement.hpp"
#include "serve_pooling.hpp"

namespace eh::cli {

using service::log_event;
namespace lvl = spdlog::level;

namespace {

// --draft-model: loaded by the served model's plugin, in this process, with
// a vocabulary that is the served model's token for token (where both
// files list their tokens; the service compares the sizes in any case).
std::shared_ptr<service::EngineSource> load_draft_model(const std::string& path, const PluginRecord& plugin,
                                                       const model::ModelFile& served, EngineLoadOptions elo) {
    auto fail = [&](Code code, const std::string& why) {
        return Error(code, fmt::format("--draft-model {}: {}", path, why));
    };
    std::shared_ptr<model::ModelFile> file;
    try {
        file = model::ModelFile::open(path);
    } catch (const Error& e) {
        throw fail(e.code(), e.what());
    }
    const auto want = served.get_string_array("tokenizer.ggml.tokens");
    const auto have = file->get_string_array("tokenizer.ggml.tokens");
    if (!want.empty() && !have.empty()) {
        if (want.size() != have.size())
            throw fail(Code::ModelLoadFailed, fmt::format("its vocabulary has {} tokens and the served model's {}; a "
                                                          "draft model must share the served model's vocabulary",
                                                          have.size(), want.size()));
        for (size_t i = 0; i < want.size(); ++i)
            if (std::string_view(want[i].data, want[i].size) != std::string_view(have[i].data, have[i].size))
                throw fail(Code::ModelLoadFailed,
                           fmt::format("its token {} differs from the served model's; a draft model must share the "
                                       "served model's vocabulary",
                                       i));
    }
    elo.progress = nullptr;
    // On the first rank's device alone: a draft model is small, and is not
    // split over a tensor-parallel set of devices.
    elo.devices.clear();
    log_event(lvl::info, "draft_model_load_start",
              {{"path", path}, {"plugin", plugin.caps.name}, {"architecture", std::string(file->architecture())}});
    std::shared_ptr<EngineModel> model;
    try {
        model = EngineModel::load(plugin.api, path, &file->view(), file, elo);
    } catch (const Error& e) {
        throw fail(e.code(), e.what());
    }
    log_event(lvl::info, "draft_model_load_complete", {{"vram_bytes", model->info().device_bytes_used}});
    return service::local_engine(std::move(model));
}

// The plugins found; the rejected ones in the log.
Registry discover(const ServeSettings& s) {
    loader::LoaderOptions lo;
    lo.device = s.gpus.empty() ? s.gpu : s.gpus[0];
    lo.open_in_process = !s.engine_process;
    Registry reg = loader::discover_plugins(s.plugin_dirs, lo);
    for (const auto* r : reg.rejected())
        log_event(lvl::warn, "plugin_rejected",
                  {{"plugin", r->caps.name}, {"library", r->library_path}, {"reasons", r->reasons}});
    return reg;
}

// The GPUs of the load (one per rank), checked before anything loads.
Placement placement_of(const ServeSettings& s, const PluginRecord& plugin, const model::ModelFile& file) {
    PlacementAsk ask;
    ask.tensor_parallel = s.tensor_parallel;
    ask.gpus = s.gpus;
    ask.gpu_device = s.gpu;
    ask.ctx_size = s.ctx_size;
    ask.kv_cache_mb = s.kv_cache_mb;
    ask.kv_type = s.kv_type;
    Placement placement = place_model(plugin, file, ask);
    if (placement.devices.size() > 1)
        log_event(lvl::info, "tensor_parallel", {{"ranks", placement.devices.size()}, {"devices", placement.json}});
    return placement;
}

// Engine plugins run in this process: if one dies on a fatal signal, the
// log's last line says which, how and when (last_words.hpp).
void set_crash_words(const PluginRecord& plugin, const char* phase) {
    http::set_last_words([name = std::string(plugin.caps.name), version = std::string(plugin.caps.version),
                          phase](const char* sig, const std::string& ts) {
        return service::format_event(
            lvl::critical, "engine_crashed",
            {{"code", "INTERNAL"}, {"signal", sig}, {"phase", phase}, {"plugin", name}, {"plugin_version", version},
             {"message", fmt::format("the engine plugin died on {} while {}; the worker exits with 128 + the "
                                     "signal number and should be restarted",
                                     sig, phase)}},
            ts);
    });
}

// The load's progress: on /health, on stderr's bar, in the log (each
// distinct stage once, the CUDA plugins' kernel plan lines among them, and
// every 25 %).
class LoadProgress {
public:
    explicit LoadProgress(http::Server* server)
        : server_(server), bar_(progress_bar_fits(STDERR_FILENO, STDOUT_FILENO)) {}

    void operator()(float f, const char* stage) {
        if (server_) server_->set_load_progress(f);
        bar_.update(f);
        if (stage && *stage && last_stage_ != stage) {
            last_stage_ = stage;
            log_event(lvl::info, "model_load_stage", {{"stage", last_stage_}});
        }
        while (next_mark_ <= 100 && f * 100.0f + 1e-3f >= float(next_mark_)) {
            log_event(lvl::info, "model_load_progress", {{"percent", next_mark_}, {"stage", stage ? stage : ""}});
            next_mark_ += 25;
        }
    }

    // A plugin that reports no progress still logs every mark.
    void done() {
        while (next_mark_ <= 100) {
            log_event(lvl::info, "model_load_progress", {{"percent", next_mark_}, {"stage", "done"}});
            next_mark_ += 25;
        }
        bar_.update(1.0f);
    }

private:
    http::Server* server_;
    LoadProgressBar bar_;
    int next_mark_ = 0;
    std::string last_stage_;
};

void log_image_encoder(const std::string& path, const service::ImageEncoder& images) {
    const auto& ii = images.info();
    if (images.sized())  // each image at its own size, one token per tile
        log_event(lvl::info, "image_encoder", {{"path", path}, {"tile_pixels", ii.tile}, {"min_tokens", ii.min_tokens},
                                               {"max_tokens", ii.max_tokens}});
    else
        log_event(lvl::info, "image_encoder", {{"path", path}, {"image_width", ii.image_width},
                                               {"image_height", ii.image_height}, {"tokens_per_image", ii.n_tokens}});
}

// Starts out.engine: a worker process (--engine-process) that loads the
// model and its adapters, or the plugin in this process with the adapters
// and the --mmproj image encoder, which it returns.
std::shared_ptr<const service::ImageEncoder> start_engine(const ServeSettings& s, const ServedModelSpec& m,
                                                          const PluginRecord& plugin,
                                                          const std::shared_ptr<model::ModelFile>& file,
                                                          const EngineLoadOptions& elo, RunningModel& out) {
    if (s.engine_process) {
        service::EngineProcessOptions epo;
        epo.argv = {"/proc/self/exe", "engine-worker", "--manifest", plugin.manifest_path, "--model", m.path,
                    "--model-name", m.name, "--gpu-device", std::to_string(s.gpu),
                    "--threads", std::to_string(elo.n_threads), "--engine-options", s.engine_options,
                    "--log-format", s.log_format, "--log-level", s.log_level_name,
                    "--worker-id", s.worker_id};
        if (s.log_content) epo.argv.push_back("--log-content");
        for (const LoraFlag& f : s.loras)  // the engine process loads the adapters beside its model
            epo.argv.insert(epo.argv.end(), {"--lora", f.name + "=" + f.path, "--lora-scale",
                                             f.name + "=" + fmt::format("{}", f.scale)});
        epo.progress = [progress = elo.progress](float f, const std::string& stage) { progress(f, stage.c_str()); };
        epo.cancel = elo.cancel;
        out.engine = service::start_engine_process(std::move(epo));
        return nullptr;
    }
    out.model = EngineModel::load(plugin.api, m.path, &file->view(), file, elo);
    out.engine = service::local_engine(out.model, load_lora_adapters(out.model, *file, s.loras));
    if (s.mmproj.empty()) return nullptr;
    // Before the Service's kv_init.
    auto images = service::ImageEncoder::load(out.model, s.mmproj, std::string(file->architecture()));
    log_image_encoder(s.mmproj, *images);
    return images;
}

// A rejected template: serve still starts (completions and /execute need
// none); chat requests answer CHAT_TEMPLATE_UNUSABLE.
void log_chat_template(const service::ChatTemplateState& chat_state, const std::string& path) {
    if (chat_state.kind == service::ChatTemplateState::Kind::Rejected)
        log_event(lvl::err, "chat_template_rejected",
                  {{"code", "CHAT_TEMPLATE_UNUSABLE"}, {"source", chat_state.source}, {"message", chat_state.error},
                   {"chat_requests", "refused until restarted with --chat-template-file"}});
    else if (chat_state.source == "file")
        log_event(lvl::info, "chat_template", {{"source", "file"}, {"path", path}});
}

// The service's options from the flags (the draft model aside).
service::ServiceOptions service_options(const ServeSettings& s, const ServedModelSpec& m, const ModelStartContext& ctx,
                                        const PluginRecord& plugin, const model::ModelFile& file,
                                        const service::TextCodec& codec, const eh_model_info& mi) {
    service::ServiceOptions sopt;
    sopt.pooling = pooling_spec(file, codec, s.pooling);
    if (sopt.pooling.mode != service::PoolingMode::None)
        log_event(lvl::info, "pooling", {{"mode", service::pooling_mode_name(sopt.pooling.mode)},
                                         {"rerank_head", sopt.pooling.head_source}});
    sopt.n_ctx = choose_context(file, mi, s.ctx_size, s.kv_cache_mb, s.kv_type);
    sopt.queue_capacity = s.queue_size;
    sopt.max_running = s.parallel;
    sopt.max_step_tokens = s.batch_tokens;
    sopt.prefill_chunk_tokens = s.prefill_chunk_tokens;
    sopt.kv_budget_bytes = s.kv_cache_mb * 1024 * 1024;
    sopt.kv_type = s.kv_type;
    sopt.kv_memory_fraction = s.gpu_memory_fraction;
    sopt.prefix_cache = s.prefix_cache;
    sopt.prefix_cache_shared = s.prefix_cache_shared;
    sopt.kv_host_bytes = s.kv_host_bytes;
    sopt.chained_steps = s.chained_steps;
    sopt.inference_timeout = s.inference_timeout;
    sopt.shutdown_grace = s.shutdown_grace;
    sopt.limits = ctx.limits;
    sopt.model_name = m.name;
    for (const LoraFlag& f : s.loras) sopt.adapters.push_back(f.name);
    if (ctx.kv_events) {
        ctx.kv_events->set_medium(plugin.caps.device_kind == std::string("cpu") ? "CPU" : "GPU");
        sopt.kv_events = ctx.kv_events;
        if (s.kv_events_block_tokens) sopt.kv_events_block_tokens = *s.kv_events_block_tokens;
        sopt.kv_events_hash_seed = s.kv_events_hash_seed;
    }
    sopt.spec = s.spec;
    return sopt;
}

// What /health and /capabilities report of the started model.
void fill_node_info(RunningModel& out, const ServeSettings& s, const ServedModelSpec& m, const Registry& reg,
                    const PluginRecord& plugin, const Placement& placement, const service::EngineFacts& facts,
                    const std::string& quant_kind, const service::TextCodec& codec) {
    const eh_model_info& mi = facts.info;
    http::NodeInfo& ni = out.info;
    ni.model = m.name;
    ni.model_aliases = m.aliases;
    ni.refuse_unknown_models = m.refuse_unknown;
    ni.architecture = mi.architecture;
    ni.quant_kind = quant_kind;
    ni.tokenizer_kind = codec.kind();
    ni.vocab_size = codec.vocab_size();
    ni.bos_id = codec.bos_id();
    ni.eos_id = codec.eos_id();
    ni.context_length = out.svc->n_ctx();
    ni.trained_context_length = mi.context_length;
    ni.max_tokens_out = s.max_tokens_out ? std::min(s.max_tokens_out, out.svc->n_ctx()) : out.svc->n_ctx();
    ni.slots = out.svc->max_running();
    ni.plugin_name = plugin.caps.name;
    ni.plugin_version = plugin.caps.version;
    ni.engine = plugin.caps.engine;
    ni.device_name = mi.device_name;
    ni.devices = placement.json;
    // The ready callback's and /health's figure: the weights and the KV pool
    // the service allocated at start (the load's figure is the weights alone).
    ni.vram_bytes_used = out.svc->device_bytes_used();
    ni.device_kind = plugin.caps.device_kind;
    ni.compute_capability = mi.compute_capability;
    ni.cuda_runtime_version = mi.runtime_version;
    ni.logprobs = facts.logits;
    ni.queue_capacity = out.svc->options().queue_capacity;
    ni.plugins = registry_json(reg);
    out.host_bytes = mi.host_bytes_used;
}

// Logged before /health answers ready, so whoever sees the one can read the other.
void log_ready(const ServeSettings& s, const ModelStartContext& ctx, const PluginRecord& plugin,
               const RunningModel& out, const service::TextCodec& codec,
               const service::ChatTemplateState& chat_state) {
    const service::Service& svc = *out.svc;
    const service::SeqLimits& kl = svc.kv_limits();
    const service::PoolingMode pooling = svc.options().pooling.mode;
    log_event(lvl::info, "ready",
              {{"uri", ctx.uri}, {"context_length", svc.n_ctx()}, {"plugin", plugin.caps.name},
               {"engine_process",
                s.engine_process ? nlohmann::json(svc.stats().engine_pid.load()) : nlohmann::json(nullptr)},
               {"tokenizer", codec.kind()},
               {"chat_template", service::chat_template_kind_name(chat_state.kind)},
               {"batched", svc.batched()},
               {"serves", pooling == service::PoolingMode::None ? "text" : service::pooling_mode_name(pooling)},
               {"max_running", svc.max_running()}, {"kv_blocks", kl.total_blocks},
               {"kv_block_tokens", kl.block_tokens}, {"kv_cache_bytes", svc.kv_cache_bytes()},
               {"kv_cache_type", service::kv_cache_type_name(kl.kv_type)},
               {"speculation", svc.speculation()}, {"devices", out.info.devices},
               {"vram_bytes", out.info.vram_bytes_used}});
}

}  // namespace

void start_model(const ServeSettings& s, const ServedModelSpec& m, const ModelStartContext& ctx, RunningModel& out) {
    const Registry reg = discover(s);
    std::shared_ptr<model::ModelFile> file = model::ModelFile::open(m.path);
    const PluginRecord& plugin = choose_plugin(reg, model_requirements(*file), s.policy,
                                               s.gpus.empty() ? s.named_gpu : std::optional<int>(s.gpus[0]));
    const Placement placement = placement_of(s, plugin, *file);
    if (!s.engine_process) set_crash_words(plugin, "loading");

    log_event(lvl::info, "model_load_start",
              {{"plugin", plugin.caps.name}, {"plugin_version", plugin.caps.version}, {"format", file->format_name()},
               {"architecture", std::string(file->architecture())}});
    LoadProgress progress(ctx.server);
    EngineLoadOptions elo;
    elo.device = placement.devices.empty() ? s.gpu : placement.devices[0];
    if (placement.devices.size() > 1) elo.devices.assign(placement.devices.begin(), placement.devices.end());
    elo.n_threads = s.threads;
    elo.options_json = s.engine_options;
    elo.progress = [&progress](float f, const char* stage) { progress(f, stage); };
    elo.cancel = ctx.cancel;
    const auto t0 = std::chrono::steady_clock::now();
    const auto images = start_engine(s, m, plugin, file, elo, out);
    const service::EngineFacts facts = out.engine->facts();
    progress.done();
    const eh_model_info& mi = facts.info;
    // The worker contract's quant_kind is the file's quantization
    // ("Q4_K_M", from general.file_type), not the plugin's dominant
    // tensor type; the plugin's answer stands in when the file has none.
    const std::string file_quant = model::describe(*file).quant_kind;
    const std::string quant_kind = file_quant.empty() ? std::string(mi.quant_kind) : file_quant;
    log_event(lvl::info, "model_load_complete",
              {{"vram_bytes", mi.device_bytes_used}, {"host_bytes", mi.host_bytes_used}, {"quant_kind", quant_kind},
               {"load_ms", std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()}});

    auto codec = make_codec(*file, s.chat_template);
    if (images && codec->encode(images->prompt().token, false, true, {}).size() != 1)
        throw Error(Code::ModelLoadFailed, fmt::format("--mmproj: the model's vocabulary has no '{}' control token, "
                                                      "with which its prompts hold an image",
                                                      images->prompt().token));
    const service::ChatTemplateState chat_state = codec->chat_template_state();
    log_chat_template(chat_state, s.chat_template_path);
    service::ServiceOptions sopt = service_options(s, m, ctx, plugin, *file, *codec, mi);
    sopt.images = images;
    if (s.spec.source == service::SpecSource::DraftModel)
        sopt.draft = load_draft_model(s.draft_model_path, plugin, *file, elo);
    out.svc = std::make_shared<service::Service>(out.engine, codec, sopt, ctx.metrics);

    fill_node_info(out, s, m, reg, plugin, placement, facts, quant_kind, *codec);
    // Residency is checked here, never on a request's path.
    std::string why;
    const bool resident = out.engine->check_residency(&why);
    if (ctx.server) ctx.server->set_resident(resident, why);
    log_ready(s, ctx, plugin, out, *codec, chat_state);
    if (ctx.server) ctx.server->attach(out.svc, out.info);
    if (!s.engine_process) set_crash_words(plugin, "serving");
}

http::ModelPool::Loader pool_loader(const ServeSettings& s, ModelStartContext ctx) {
    ctx.server = nullptr;
    return [&s, ctx](const http::PoolModelSpec& spec) {
        ServedModelSpec m;
        m.ref = m.path = spec.path;
        m.name = spec.name;
        m.aliases = spec.aliases;
        m.refuse_unknown = true;
        RunningModel r;
        try {
            start_model(s, m, ctx, r);
        } catch (...) {
            r.svc.reset();
            r.engine.reset();
            r.model.reset();
            throw;
        }
        http::PooledModel p;
        p.service = r.svc;
        p.info = r.info;
        p.memory_bytes = r.svc->device_bytes_used() + r.host_bytes;
        p.release = [engine = std::move(r.engine), model = std::move(r.model)]() mutable {
            engine.reset();  // an engine process sees its socket close and exits
            model.reset();
        };
        return p;
    };
}

}  // namespace eh::cli
