// Helpers for the constrained-decoding tests: a one-byte-per-token
// vocabulary (plus an end token) and a matcher over a grammar.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "eh/constrain/automaton.hpp"
#include "eh/constrain/grammar.hpp"

namespace eh::constrain::test {

inline constexpr int32_t kByteEnd = 256;

inline std::shared_ptr<const TokenVocab> byte_vocab() {
    static const auto v = [] {
        std::vector<std::string> bytes;
        for (int b = 0; b < 256; ++b) bytes.emplace_back(1, char(b));
        bytes.emplace_back();  // the end token
        return std::make_shared<const TokenVocab>(std::move(bytes), std::vector<int32_t>{kByteEnd});
    }();
    return v;
}

inline Matcher matcher(std::shared_ptr<const Grammar> g) {
    return Matcher(std::make_shared<Automaton>(std::move(g), byte_vocab()));
}

// Does the grammar match exactly `text`?
inline bool matches(const std::shared_ptr<const Grammar>& g, std::string_view text) {
    Matcher m = matcher(g);
    return m.accept_bytes(text) && m.accepting();
}

// Is `text` a prefix of some match?
inline bool prefix_ok(const std::shared_ptr<const Grammar>& g, std::string_view text) {
    Matcher m = matcher(g);
    return m.accept_bytes(text);
}

// What a grammar does with strings: it matches each of `match` and none of
// `no_match`; each of `prefix` starts a match, none of `no_prefix` does.
struct Language {
    std::vector<std::string> match = {}, no_match = {}, prefix = {}, no_prefix = {};
};

inline void expect_language(const std::shared_ptr<const Grammar>& g, const Language& l) {
    for (const auto& s : l.match) EXPECT_TRUE(matches(g, s)) << "should match '" << s << "'";
    for (const auto& s : l.no_match) EXPECT_FALSE(matches(g, s)) << "should not match '" << s << "'";
    for (const auto& s : l.prefix) EXPECT_TRUE(prefix_ok(g, s)) << "'" << s << "' should start a match";
    for (const auto& s : l.no_prefix) EXPECT_FALSE(prefix_ok(g, s)) << "'" << s << "' should start no match";
}

}  // namespace eh::constrain::test
