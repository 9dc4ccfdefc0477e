// The Responses API's store of finished responses (`store`, default true):
// what previous_response_id continues from and GET / DELETE
// /v1/responses/{id} read. In memory only, bounded by a count and a byte
// total (ServerOptions::responses_max, responses_max_bytes). When full, the
// scope holding the most bytes gives up its least recently used (stored or
// read) response first, so one API key's traffic evicts its own responses
// before anyone else's. Each response is kept with the
// prefix-cache scope of the request that made it (a digest of its API key,
// "" without keys) and is found only under that scope: one key can neither
// read, continue nor delete another key's responses, and cannot tell them
// from ids that never existed.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "eh/service/text_codec.hpp"

namespace eh::http {

struct StoredResponse {
    std::string scope;
    std::string response_json;  // the response object, as GET returns it
    // The conversation up to and including this response's output, without
    // its instructions (a continuation gets only its own, as OpenAI's does).
    std::vector<service::ChatMessage> conversation;
};

class ResponseStore {
public:
    ResponseStore(size_t max_count, size_t max_bytes) : max_count_(max_count), max_bytes_(max_bytes) {}

    // Keeps `r` under `id`, evicting while over a limit (the largest
    // scope's least recently used first). false (nothing kept) when it alone is larger than max_bytes or
    // max_count is 0.
    bool put(const std::string& id, StoredResponse r);
    // The response under `id` made in `scope` (null when there is none),
    // now the most recently used.
    std::shared_ptr<const StoredResponse> get(const std::string& id, const std::string& scope);
    bool erase(const std::string& id, const std::string& scope);

    size_t size() const;
    size_t bytes() const;
    // What a response counts against max_bytes: its text, ids and a fixed
    // overhead per message.
    static size_t cost(const std::string& id, const StoredResponse& r);

private:
    struct Entry {
        std::shared_ptr<const StoredResponse> r;
        size_t bytes = 0;
        std::list<std::string>::iterator lru;  // position in its scope's lru (front: most recent)
    };
    struct Scope {
        std::list<std::string> lru;  // ids, most recent first
        size_t bytes = 0;
    };
    void drop(std::unordered_map<std::string, Entry>::iterator it);
    void evict_one();  // the largest scope's least recently used

    const size_t max_count_, max_bytes_;
    mutable std::mutex mu_;
    std::unordered_map<std::string, Entry> map_;
    std::unordered_map<std::string, Scope> scopes_;
    size_t bytes_ = 0;
};

}  // namespace eh::http
