#include "eh/constrain/vocab.hpp"

#include <algorithm>
#include <numeric>

namespace eh::constrain {

TokenVocab::TokenVocab(std::vector<std::string> bytes, std::vector<int32_t> eog)
    : bytes_(std::move(bytes)), eog_(std::move(eog)), eog_flag_(bytes_.size(), 0) {
    std::erase_if(eog_, [&](int32_t id) { return id < 0 || size_t(id) >= bytes_.size(); });
    for (int32_t id : eog_) eog_flag_[size_t(id)] = 1;
    // Sorted by bytes, each token adds the nodes past its common prefix with
    // the one before: the trie in preorder.
    std::vector<int32_t> order;
    for (size_t i = 0; i < bytes_.size(); ++i)
        if (!bytes_[i].empty() && !eog_flag_[i]) order.push_back(int32_t(i));
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return bytes_[size_t(a)] != bytes_[size_t(b)] ? bytes_[size_t(a)] < bytes_[size_t(b)] : a < b;
    });
    std::vector<uint32_t> path;  // node index per depth of the previous token
    const std::string* prev = nullptr;
    for (int32_t id : order) {
        const std::string& s = bytes_[size_t(id)];
        size_t common = 0;
        if (prev)
            while (common < s.size() && common < prev->size() && s[common] == (*prev)[common]) ++common;
        path.resize(common);
        for (size_t d = common; d < s.size(); ++d) {
            Node n;
            n.depth = uint32_t(d + 1);
            n.byte = uint8_t(s[d]);
            path.push_back(uint32_t(nodes_.size()));
            nodes_.push_back(n);
        }
        // Tokens are added in order, so a node's tokens are contiguous.
        Node& last = nodes_[path.back()];
        if (last.tok_begin == last.tok_end) last.tok_begin = last.tok_end = uint32_t(tokens_.size());
        tokens_.push_back(id);
        ++last.tok_end;
        max_depth_ = std::max(max_depth_, uint32_t(s.size()));
        prev = &s;
    }
    // skip: the first later node at the same or a smaller depth.
    std::vector<uint32_t> open;
    for (uint32_t i = 0; i < nodes_.size(); ++i) {
        while (!open.empty() && nodes_[open.back()].depth >= nodes_[i].depth) {
            nodes_[open.back()].skip = i;
            open.pop_back();
        }
        open.push_back(i);
    }
    for (uint32_t i : open) nodes_[i].skip = uint32_t(nodes_.size());
}

bool TokenVocab::is_eog(int32_t id) const { return id >= 0 && size_t(id) < eog_flag_.size() && eog_flag_[size_t(id)]; }

}  // namespace eh::constrain
