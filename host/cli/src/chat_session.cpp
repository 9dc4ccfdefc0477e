#include "chat_session.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "device_choice.hpp"
#include "eh/error.hpp"
#include "eh/loader/engine.hpp"
#include "eh/loader/plugin_loader.hpp"
#include "eh/model/model_file.hpp"
#include "eh/service/event_log.hpp"
#include "eh/service/service.hpp"
#include "serve_codec.hpp"
#include "serve_model.hpp"

namespace eh::cli {

struct ChatSession::Impl {
    Registry registry;  // keeps the plugin library loaded
    std::shared_ptr<EngineModel> model;
    std::shared_ptr<service::Service> svc;
    ChatSettings settings;
    std::string plugin;
    uint64_t next_id = 0;
};

ChatSession::ChatSession(const ChatSettings& s) : impl_(std::make_unique<Impl>()) {
    impl_->settings = s;
    service::LogSettings ls;
    ls.json = false;
    ls.level = spdlog::level::off;  // the terminal is the conversation; errors come back as job events
    service::init_event_log(ls);

    loader::LoaderOptions lo;
    lo.device = s.gpu;
    impl_->registry = loader::discover_plugins(s.plugin_dirs, lo);
    std::shared_ptr<model::ModelFile> file = model::ModelFile::open(s.model_path);
    const PluginRecord& plugin = choose_plugin(impl_->registry, model_requirements(*file), s.device,
                                                s.gpu_named ? std::optional<int>(s.gpu) : std::nullopt);
    impl_->plugin = plugin.caps.name;
    // Before the (slow) load: a template that cannot be used ends the chat.
    auto codec = make_codec(*file, s.chat_template);
    if (const service::ChatTemplateState t = codec->chat_template_state(); t.kind == service::ChatTemplateState::Kind::Rejected)
        throw service::ChatTemplateUnusable(t);
    EngineLoadOptions elo;
    elo.device = s.gpu;
    elo.n_threads = s.threads;
    impl_->model = EngineModel::load(plugin.api, s.model_path, &file->view(), file, elo);
    service::ServiceOptions so;
    so.n_ctx = choose_context(*file, impl_->model->info(), s.ctx_size, 0);
    so.model_name = model_id(s.model_path);
    so.kv_type = s.kv_type;
    so.queue_capacity = 1;
    // One conversation: one running sequence, plus the previous turn kept in
    // the prefix cache, so each turn computes only its new tokens.
    so.max_running = 1;
    so.inference_timeout = std::chrono::hours(24);  // the person at the terminal decides (Ctrl-C)
    impl_->svc = std::make_shared<service::Service>(impl_->model, std::move(codec), so);
}

ChatSession::~ChatSession() {
    if (impl_->svc) impl_->svc->shutdown();
}

std::string ChatSession::describe() const {
    return fmt::format("{} via {}, context {} tokens", model_id(impl_->settings.model_path), impl_->plugin,
                       impl_->svc->n_ctx());
}

uint32_t ChatSession::context_tokens() const { return impl_->svc->n_ctx(); }

std::string ChatSession::reply(const std::vector<service::ChatMessage>& messages,
                               const std::function<void(const std::string&)>& on_text, const std::atomic<bool>& stop,
                               bool* filled) {
    const ChatSettings& s = impl_->settings;
    service::GenerationRequest req;
    req.job_id = fmt::format("chat-{}", ++impl_->next_id);
    service::ChatPrompt prompt = impl_->svc->codec().render_chat(messages, [&stop] { return stop.load(); });
    req.prompt = std::move(prompt.text);
    req.literal = std::move(prompt.literal);  // what the user typed stays text
    req.add_special = false;  // as the OpenAI chat endpoint: the template writes BOS
    req.parse_special = true;
    // The reply gets what the context has left after the conversation so
    // far, at most --n-predict: counted here, with the service's own encoding
    // (the same call as Service::prepare), so the request always fits.
    const uint32_t ctx = impl_->svc->n_ctx();
    const size_t prompt_tokens = impl_->svc->codec().encode(req.prompt, req.add_special, req.parse_special, req.literal).size();
    if (prompt_tokens >= ctx)
        throw Error(Code::ContextFull, fmt::format("the conversation fills the context ({} tokens; this turn's prompt "
                                                   "is {})", ctx, prompt_tokens));
    const uint32_t room = uint32_t(ctx - prompt_tokens);
    req.max_tokens = std::min(s.max_tokens, room);
    if (filled) *filled = false;
    req.sampling.temperature = s.temperature;
    req.sampling.top_p = s.top_p;
    req.sampling.top_k = s.top_k;
    req.sampling.seed = s.seed;
    req.origin = "chat";
    auto job = impl_->svc->submit(req);
    std::string text;
    bool cancelled = false;
    while (true) {
        if (stop && !cancelled) {
            impl_->svc->cancel(req.job_id);
            cancelled = true;
        }
        auto ev = job->pop(std::chrono::milliseconds(50));
        if (!ev) continue;
        if (ev->kind == service::JobEvent::Kind::Token) {
            text += ev->text;
            on_text(ev->text);
        } else if (ev->kind == service::JobEvent::Kind::End) {
            // Cut by the context rather than by --n-predict: the next turn
            // has no room.
            if (filled) *filled = ev->stop_reason == "length" && *req.max_tokens == room && room < s.max_tokens;
            return text;
        } else if (ev->kind == service::JobEvent::Kind::Error) {
            if (ev->code == Code::Cancelled && cancelled) return text;
            throw Error(ev->code, ev->message);
        }
    }
}

}  // namespace eh::cli
