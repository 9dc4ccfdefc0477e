#include "eh/service/constraint_cache.hpp"

#include <algorithm>
#include <span>

#include "eh/constrain/grammar.hpp"

namespace eh::service {

std::shared_ptr<const constrain::TokenVocab> ConstraintCache::vocab() {
    std::call_once(vocab_once_, [&] {
        const uint32_t n = codec_->vocab_size();
        std::vector<std::string> bytes(std::max(n, n_logits_));
        std::vector<int32_t> eog;
        for (uint32_t i = 0; i < n; ++i) {
            if (codec_->is_eog(int32_t(i))) eog.push_back(int32_t(i));
            else bytes[i] = codec_->token_bytes(int32_t(i));
            if (bytes[i].empty() && !codec_->is_eog(int32_t(i))) {
                // A control token: allowed only where a server-built
                // grammar names it (vocab.hpp).
                const int32_t id = int32_t(i);
                const std::string text = codec_->decode_with_control(std::span<const int32_t>(&id, 1));
                if (!text.empty()) bytes[i] = constrain::control_token_bytes(text);
            }
        }
        vocab_ = std::make_shared<const constrain::TokenVocab>(std::move(bytes), std::move(eog));
    });
    return vocab_;
}

std::shared_ptr<constrain::Automaton> ConstraintCache::get(const OutputConstraint& c) {
    using Kind = OutputConstraint::Kind;
    const std::string key = std::to_string(int(c.kind)) + ':' + c.text;
    {
        std::lock_guard lock(mu_);
        for (auto it = lru_.begin(); it != lru_.end(); ++it)
            if (it->first == key) {
                lru_.splice(lru_.begin(), lru_, it);
                return it->second;
            }
    }
    std::shared_ptr<const constrain::Grammar> g;
    std::shared_ptr<constrain::Automaton> a;
    try {
        switch (c.kind) {
        case Kind::JsonObject: g = constrain::json_object_grammar(); break;
        case Kind::JsonSchema: g = constrain::json_schema_grammar(c.text); break;
        case Kind::Grammar: g = constrain::gbnf_grammar(c.text); break;
        case Kind::Prebuilt: g = c.grammar; break;
        case Kind::None: break;
        }
        if (!g) throw RequestError(c.field, "no grammar was given for the output constraint");
        a = std::make_shared<constrain::Automaton>(std::move(g), vocab());  // computes the start state
    } catch (const constrain::GrammarError& e) {
        throw RequestError(c.field, std::string(e.what()));
    }
    std::lock_guard lock(mu_);
    lru_.emplace_front(key, a);
    if (lru_.size() > kCapacity) lru_.pop_back();
    return a;
}

}  // namespace eh::service
