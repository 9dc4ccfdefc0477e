#include "eh/service/chat_prompt.hpp"
#include "eh/service/service.hpp"
#include "impl.hpp"

namespace eh::http {

namespace {

// Runs `render` with the cancel hook a template polls: the server stopping
// or the client gone. Stopping turns the cancel into SHUTTING_DOWN.
void with_template_cancel(Server::Impl& s, const std::function<void(const std::function<bool()>&)>& render) {
    auto stopping = [&s] { return s.state.load() == State::Stopping; };
    try {
        render([&] { return stopping() || current_client_gone(); });
    } catch (const Error& e) {
        if (e.code() == Code::Cancelled && stopping())
            throw Error(Code::ShuttingDown, "the server is shutting down; the chat template's evaluation was stopped");
        throw;
    }
}

}  // namespace

void render_chat_prompt(Server::Impl& s, const service::Service& svc, service::ChatRequest& r, const std::string& model) {
    with_template_cancel(s, [&](const std::function<bool()>& cancelled) {
        service::render_chat_prompt(svc.codec(), r, model, cancelled);
    });
}

}  // namespace eh::http
