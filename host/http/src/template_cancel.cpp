#include "eh/service/chat_prompt.hpp"
#include "eh/service/service.hpp"
#include "impl.hpp"

namespace eh::http {

void render_chat_cancellable(Server::Impl& s, const service::Service& svc, service::ChatRequest& r) {
    auto stopping = [&s] { return s.state.load() == State::Stopping; };
    try {
        service::render_chat_prompt(svc.codec(), r, s.get_info().model, s.options.limits,
                                    [&] { return stopping() || current_client_gone(); });
    } catch (const Error& e) {
        if (e.code() == Code::Cancelled && stopping())
            throw Error(Code::ShuttingDown, "the server is shutting down; the chat template's evaluation was stopped");
        throw;
    }
}

}  // namespace eh::http
