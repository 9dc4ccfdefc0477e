#include "serve_codec.hpp"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "eh/error.hpp"
#include "eh/service/chat_output.hpp"
#include "eh/service/chat_prompt.hpp"
#include "eh/tokenizer/tokenizer.hpp"

namespace eh::cli {
namespace {

class TokenizerCodec : public service::TextCodec {
public:
    // `chat`: --chat-template-file's template when given, else nullopt (the
    // model's own is compiled here).
    TokenizerCodec(std::unique_ptr<tokenizer::Tokenizer> tok, std::optional<ChatTemplateChoice> chat)
        : tok_(std::move(tok)), literals_(tok_->special_texts()),
          chat_(chat ? std::move(*chat) : chat_template_from_model(tok_->chat_template())) {
        if (chat_.compiled) tool_format_ = service::tool_format_of_template(chat_.source);
        const auto& sp = tok_->special();
        if (sp.bos >= 0) bos_text_ = tok_->token_text(sp.bos);
        if (sp.eos >= 0) eos_text_ = tok_->token_text(sp.eos);
    }

    std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special,
                                std::span<const service::TextSpan> literal) const override {
        if (!parse_special || literal.empty()) return tok_->encode(text, add_special, parse_special);
        std::vector<tokenizer::Tokenizer::Range> ranges;
        for (const auto& s : literal) ranges.emplace_back(s.begin, s.end);
        return tok_->encode_with_literals(text, add_special, ranges);
    }
    std::string decode(std::span<const int32_t> tokens) const override { return tok_->decode(tokens, false); }
    std::string decode_with_control(std::span<const int32_t> tokens) const override { return tok_->decode(tokens, true); }
    std::string token_bytes(int32_t token) const override { return tok_->token_to_piece(token, false); }
    service::ToolFormat tool_format() const override { return tool_format_; }
    service::ChatTemplateState chat_template_state() const override { return chat_.state; }
    bool is_eog(int32_t token) const override { return tok_->is_eog(token); }
    uint32_t vocab_size() const override { return uint32_t(tok_->vocab_size()); }
    std::string kind() const override { return std::string(tok_->kind()); }
    int32_t bos_id() const override { return tok_->special().bos; }
    int32_t eos_id() const override { return tok_->special().eos; }

    service::ChatPrompt render_chat(const std::vector<service::ChatMessage>& messages,
                                    const std::function<bool()>& cancelled,
                                    const service::ChatRenderOptions& options) const override {
        // Never the plain transcript in place of a template that failed.
        if (chat_.state.kind == service::ChatTemplateState::Kind::Rejected)
            throw service::ChatTemplateUnusable(chat_.state);
        service::ApplyTemplate apply;
        if (chat_.compiled)
            apply = [&](const std::string& messages_json) {
                tokenizer::ChatOptions opt;
                opt.bos_token = bos_text_;
                opt.eos_token = eos_text_;
                opt.tools_json = options.tools_json;
                opt.extra_json = options.extra_json;
                opt.cancelled = cancelled;
                return chat_.compiled->render(messages_json, opt);
            };
        return service::compose_chat_prompt(messages, literals_, apply, tok_->add_bos() ? bos_text_ : std::string());
    }

private:
    std::unique_ptr<tokenizer::Tokenizer> tok_;
    service::ChatLiterals literals_;
    ChatTemplateChoice chat_;
    std::string bos_text_, eos_text_;
    service::ToolFormat tool_format_ = service::ToolFormat::None;
};

}  // namespace

std::shared_ptr<service::TextCodec> make_codec(const model::ModelFile& file, std::optional<ChatTemplateChoice> chat) {
    std::optional<std::filesystem::path> hf_dir;
    if (file.format() == EH_FORMAT_SAFETENSORS) hf_dir = std::filesystem::path(file.path());
    return std::make_shared<TokenizerCodec>(tokenizer::load_tokenizer(file.view(), hf_dir), std::move(chat));
}

}  // namespace eh::cli
