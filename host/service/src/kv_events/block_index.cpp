#include <openssl/evp.h>

#include <nlohmann/json.hpp>

#include "eh/error.hpp"
#include "eh/service/kv_events.hpp"

namespace eh::service {
namespace {

// The low 64 bits of SHA-256(bytes), read big-endian: bytes 24-31.
uint64_t sha256_low64(const std::vector<uint8_t>& bytes) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (EVP_Digest(bytes.data(), bytes.size(), md, &n, EVP_sha256(), nullptr) != 1 || n != 32)
        throw Error(Code::Internal, "SHA-256 is unavailable");
    uint64_t v = 0;
    for (int i = 24; i < 32; ++i) v = (v << 8) | md[i];
    return v;
}

}  // namespace

// nlohmann's CBOR writer gives each integer, string and array its shortest
// head, which is canonical CBOR for these types (what llm-d's encoder and
// cbor2's canonical mode write).
uint64_t kv_root_hash(std::string_view seed) {
    return sha256_low64(nlohmann::json::to_cbor(nlohmann::json(std::string(seed))));
}

uint64_t kv_block_hash(uint64_t parent, std::span<const int32_t> tokens) {
    nlohmann::json ids = nlohmann::json::array();
    for (int32_t t : tokens) ids.push_back(uint32_t(t));
    return sha256_low64(nlohmann::json::to_cbor(nlohmann::json::array({parent, std::move(ids), nullptr})));
}

KvBlockIndex::KvBlockIndex(std::shared_ptr<KvEventSink> sink, uint32_t block_tokens, std::string_view seed)
    : sink_(std::move(sink)), block_tokens_(block_tokens ? block_tokens : 1), root_(kv_root_hash(seed)) {}

std::vector<uint64_t> KvBlockIndex::chain(std::span<const int32_t> tokens) const {
    std::vector<uint64_t> out;
    uint64_t parent = root_;
    for (size_t at = 0; at + block_tokens_ <= tokens.size(); at += block_tokens_) {
        parent = kv_block_hash(parent, tokens.subspan(at, block_tokens_));
        out.push_back(parent);
    }
    return out;
}

void KvBlockIndex::add(std::span<const int32_t> tokens) {
    const std::vector<uint64_t> hashes = chain(tokens);
    // Blocks new to the cache: a suffix of the chain, since every cached
    // sequence holding a block holds the blocks before it.
    size_t first_new = hashes.size();
    for (size_t i = 0; i < hashes.size(); ++i)
        if (refs_[hashes[i]]++ == 0 && first_new == hashes.size()) first_new = i;
    if (first_new == hashes.size()) return;
    KvEvent e;
    e.kind = KvEvent::Kind::BlockStored;
    e.hashes.assign(hashes.begin() + long(first_new), hashes.end());
    if (first_new > 0) e.parent = hashes[first_new - 1];
    e.tokens.assign(tokens.begin() + long(first_new * block_tokens_), tokens.begin() + long(hashes.size() * block_tokens_));
    e.block_tokens = block_tokens_;
    sink_->publish({std::move(e)});
}

void KvBlockIndex::remove(std::span<const int32_t> tokens) {
    const std::vector<uint64_t> hashes = chain(tokens);
    KvEvent e;
    e.kind = KvEvent::Kind::BlockRemoved;
    // Deepest first: an indexer never holds a block whose parent it dropped.
    for (size_t i = hashes.size(); i-- > 0;) {
        auto it = refs_.find(hashes[i]);
        if (it == refs_.end()) continue;
        if (--it->second == 0) {
            refs_.erase(it);
            e.hashes.push_back(hashes[i]);
        }
    }
    if (!e.hashes.empty()) sink_->publish({std::move(e)});
}

void KvBlockIndex::clear() {
    std::vector<KvEvent> batch;
    if (!refs_.empty()) {
        // Each removed block named too: llm-d's indexer ignores
        // AllBlocksCleared and would keep them otherwise.
        KvEvent removed;
        removed.kind = KvEvent::Kind::BlockRemoved;
        for (const auto& [hash, n] : refs_) removed.hashes.push_back(hash);
        batch.push_back(std::move(removed));
    }
    refs_.clear();
    KvEvent cleared;
    cleared.kind = KvEvent::Kind::AllBlocksCleared;
    batch.push_back(std::move(cleared));
    sink_->publish(std::move(batch));
}

}  // namespace eh::service
