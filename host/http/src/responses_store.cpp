#include "responses_store.hpp"

namespace eh::http {

namespace {
constexpr size_t kEntryOverhead = 256;    // map node, list node, the record
constexpr size_t kMessageOverhead = 128;  // a ChatMessage's strings and vector
}  // namespace

size_t ResponseStore::cost(const std::string& id, const StoredResponse& r) {
    size_t n = kEntryOverhead + 2 * id.size() + r.scope.size() + r.response_json.size();
    for (const auto& m : r.conversation) {
        n += kMessageOverhead + m.role.size() + m.content.size() + m.reasoning.size() + m.tool_call_id.size() + m.name.size();
        for (const auto& c : m.tool_calls) n += kMessageOverhead + c.id.size() + c.name.size() + c.arguments.size();
    }
    return n;
}

void ResponseStore::drop(std::unordered_map<std::string, Entry>::iterator it) {
    bytes_ -= it->second.bytes;
    lru_.erase(it->second.lru);
    map_.erase(it);
}

bool ResponseStore::put(const std::string& id, StoredResponse r) {
    const size_t bytes = cost(id, r);
    std::lock_guard lock(mu_);
    if (auto it = map_.find(id); it != map_.end()) drop(it);
    if (max_count_ == 0 || bytes > max_bytes_) return false;
    while (!lru_.empty() && (map_.size() + 1 > max_count_ || bytes_ + bytes > max_bytes_)) drop(map_.find(lru_.back()));
    lru_.push_front(id);
    map_[id] = Entry{std::make_shared<const StoredResponse>(std::move(r)), bytes, lru_.begin()};
    bytes_ += bytes;
    return true;
}

std::shared_ptr<const StoredResponse> ResponseStore::get(const std::string& id, const std::string& scope) {
    std::lock_guard lock(mu_);
    auto it = map_.find(id);
    if (it == map_.end() || it->second.r->scope != scope) return nullptr;
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    return it->second.r;
}

bool ResponseStore::erase(const std::string& id, const std::string& scope) {
    std::lock_guard lock(mu_);
    auto it = map_.find(id);
    if (it == map_.end() || it->second.r->scope != scope) return false;
    drop(it);
    return true;
}

size_t ResponseStore::size() const {
    std::lock_guard lock(mu_);
    return map_.size();
}

size_t ResponseStore::bytes() const {
    std::lock_guard lock(mu_);
    return bytes_;
}

}  // namespace eh::http
