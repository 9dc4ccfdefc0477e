#include "eh/service/service.hpp"
#include "impl.hpp"

namespace eh::http {

void render_chat_prompt(Server::Impl& s, const service::Service& svc, const std::vector<service::ChatMessage>& messages,
                        service::GenerationRequest& gen) {
    auto stopping = [&s] { return s.state.load() == State::Stopping; };
    service::ChatPrompt p;
    try {
        p = svc.codec().render_chat(messages, [&] { return stopping() || current_client_gone(); });
    } catch (const Error& e) {
        if (e.code() == Code::Cancelled && stopping())
            throw Error(Code::ShuttingDown, "the server is shutting down; the chat template's evaluation was stopped");
        throw;
    }
    gen.prompt = std::move(p.text);
    gen.literal = std::move(p.literal);
}

}  // namespace eh::http
