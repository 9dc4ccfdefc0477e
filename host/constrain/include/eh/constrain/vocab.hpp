// Constrained decoding, part 2: the vocabulary as the mask sees it — each
// token's output bytes (what the token adds to the text: SPM "▁" already a
// space, <0xXX> that byte, byte-level BPE already decoded) and the tokens
// that end generation. Built once per model; immutable, shared.
//
// The tokens are also laid out as a trie in preorder, so one walk with the
// matcher visits every token while skipping whole subtrees whose common
// prefix the grammar already refuses.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace eh::constrain {

// A control token's bytes in the mask's vocabulary (a token that adds no
// output text, such as gpt-oss's <|message|>): kControlByte, then its text.
// 0xFF never occurs in UTF-8 and the grammars a request brings (JSON
// schemas, GBNF) match UTF-8 only, so they never allow a control token; a
// grammar the server builds may name one with these bytes (harmony's forced
// tool calls, whose headers are control tokens).
inline constexpr char kControlByte = '\xFF';
inline std::string control_token_bytes(std::string_view text) { return kControlByte + std::string(text); }

class TokenVocab {
public:
    struct Node {
        uint32_t depth = 0;      // 1 for a token's first byte
        uint32_t skip = 0;       // index of the next node outside this subtree
        uint32_t tok_begin = 0;  // tokens whose bytes end here: tokens()[tok_begin, tok_end)
        uint32_t tok_end = 0;
        uint8_t byte = 0;
    };

    // bytes[id]: the token's output bytes (control_token_bytes for control
    // tokens; "" for tokens never allowed). eog: ids that end generation;
    // allowed exactly where the grammar accepts.
    TokenVocab(std::vector<std::string> bytes, std::vector<int32_t> eog);

    size_t size() const { return bytes_.size(); }
    const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
    const std::vector<int32_t>& eog() const { return eog_; }
    bool is_eog(int32_t id) const;
    const std::vector<Node>& nodes() const { return nodes_; }
    const std::vector<int32_t>& tokens() const { return tokens_; }
    uint32_t max_depth() const { return max_depth_; }

private:
    std::vector<std::string> bytes_;
    std::vector<int32_t> eog_;
    std::vector<uint8_t> eog_flag_;
    std::vector<Node> nodes_;
    std::vector<int32_t> tokens_;
    uint32_t max_depth_ = 0;
};

}  // namespace eh::constrain
