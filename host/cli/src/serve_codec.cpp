// Stand-in codec until host/tokenizer lands: decodes SentencePiece-style
// vocabularies exactly (U+2581 as space, <0xNN> byte tokens) and encodes by
// greedy longest match, which is enough to drive an engine end to end but is
// not the model's real segmentation. Replace with an adapter over
// eh::tokenizer::Tokenizer.
#include "serve_codec.hpp"

#include <algorithm>
#include <string_view>
#include <unordered_map>

#include "eh/error.hpp"

namespace eh::cli {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581

class VocabCodec : public service::TextCodec {
public:
    explicit VocabCodec(const model::ModelFile& f) {
        auto toks = f.get_string_array("tokenizer.ggml.tokens");
        if (toks.empty()) throw Error(Code::ModelLoadFailed, "the model has no tokenizer.ggml.tokens vocabulary");
        pieces_.reserve(toks.size());
        for (size_t i = 0; i < toks.size(); ++i) {
            std::string p(model::to_sv(toks[i]));
            std::string text = p;
            if (p.size() == 6 && p.rfind("<0x", 0) == 0 && p.back() == '>') {
                text = std::string(1, char(std::stoi(p.substr(3, 2), nullptr, 16)));
                bytes_[uint8_t(text[0])] = int32_t(i);
            } else {
                size_t pos;
                while ((pos = text.find(kSpace)) != std::string::npos) text.replace(pos, kSpace.size(), " ");
                if (!(p.size() > 2 && p.front() == '<' && p.back() == '>')) by_text_.emplace(text, int32_t(i));
                max_len_ = std::max(max_len_, text.size());
            }
            pieces_.push_back(text);
        }
        if (auto v = f.get_uint("tokenizer.ggml.bos_token_id")) bos_ = int32_t(*v);
        if (auto v = f.get_uint("tokenizer.ggml.eos_token_id")) eos_ = int32_t(*v);
        if (auto v = f.get_uint("tokenizer.ggml.eot_token_id")) eot_ = int32_t(*v);
        if (auto m = f.get_string("tokenizer.ggml.model")) kind_ = std::string(*m);
        if (auto t = f.get_string("tokenizer.chat_template")) has_template_ = !t->empty();
    }

    std::vector<int32_t> encode(std::string_view text, bool add_special) const override {
        std::vector<int32_t> out;
        if (add_special && bos_ >= 0) out.push_back(bos_);
        std::string s = " " + std::string(text);
        size_t i = 0;
        while (i < s.size()) {
            size_t n = std::min(max_len_, s.size() - i);
            for (; n > 0; --n) {
                auto it = by_text_.find(s.substr(i, n));
                if (it != by_text_.end()) {
                    out.push_back(it->second);
                    break;
                }
            }
            if (n == 0) {
                auto b = bytes_.find(uint8_t(s[i]));
                if (b != bytes_.end()) out.push_back(b->second);
                n = 1;
            }
            i += n;
        }
        return out;
    }

    std::string decode(std::span<const int32_t> tokens) const override {
        std::string out;
        for (int32_t t : tokens) {
            if (t < 0 || size_t(t) >= pieces_.size() || t == bos_ || is_eog(t)) continue;
            out += pieces_[size_t(t)];
        }
        return out;
    }

    bool is_eog(int32_t t) const override { return (eos_ >= 0 && t == eos_) || (eot_ >= 0 && t == eot_); }
    uint32_t vocab_size() const override { return uint32_t(pieces_.size()); }
    std::string kind() const override { return kind_ + " (greedy stand-in)"; }
    std::string render_chat(const std::vector<service::ChatMessage>& messages) const override {
        return service::render_plain_chat(messages);
    }

private:
    std::vector<std::string> pieces_;
    std::unordered_map<std::string, int32_t> by_text_;
    std::unordered_map<uint8_t, int32_t> bytes_;
    size_t max_len_ = 1;
    int32_t bos_ = -1, eos_ = -1, eot_ = -1;
    std::string kind_ = "unknown";
    bool has_template_ = false;
};

}  // namespace

std::shared_ptr<service::TextCodec> make_codec(const model::ModelFile& file) {
    return std::make_shared<VocabCodec>(file);
}

}  // namespace eh::cli
