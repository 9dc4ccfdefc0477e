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
    auto sc = scopes_.find(it->second.r->scope);
    sc->second.bytes -= it->second.bytes;
    sc->second.lru.erase(it->second.lru);
    if (sc->second.lru.empty()) scopes_.erase(sc);
    map_.erase(it);
}

void ResponseStore::evict_one() {
    auto largest = scopes_.begin();
    for (auto it = scopes_.begin(); it != scopes_.end(); ++it)
        if (it->second.bytes > largest->second.bytes) largest = it;
    drop(map_.find(largest->second.lru.back()));
}

bool ResponseStore::put(const std::string& id, StoredResponse r) {
    const size_t bytes = cost(id, r);
    std::lock_guard lock(mu_);
    if (auto it = map_.find(id); it != map_.end()) drop(it);
    if (max_count_ == 0 || bytes > max_bytes_) return false;
    while (!map_.empty() && (map_.size() + 1 > max_count_ || bytes_ + bytes > max_bytes_)) evict_one();
    Scope& sc = scopes_[r.scope];
    sc.lru.push_front(id);
    sc.bytes += bytes;
    map_[id] = Entry{std::make_shared<const StoredResponse>(std::move(r)), bytes, sc.lru.begin()};
    bytes_ += bytes;
    return true;
}

std::shared_ptr<const StoredResponse> ResponseStore::get(const std::string& id, const std::string& scope) {
    std::lock_guard lock(mu_);
    auto it = map_.find(id);
    if (it == map_.end() || it->second.r->scope != scope) return nullptr;
    std::list<std::string>& lru = scopes_[scope].lru;
    lru.splice(lru.begin(), lru, it->second.lru);
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
