#include "eh/tools/loadgen.hpp"

#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <regex>
#include <string_view>
#include <thread>

#include "eh/error.hpp"
#include "eh/tools/bench.hpp"
#include "eh/tools/chat_workload.hpp"

namespace eh::tools {
namespace {

using Clock = std::chrono::steady_clock;

// Distinct prompts of about 25 tokens, so no two requests share a prefix
// beyond a few words.
std::string prompt_for(uint32_t level, uint32_t client, uint32_t k) {
    static const char* subjects[] = {"a lighthouse keeper", "a small robot", "two old friends", "a river",
                                     "a baker", "a lost kite", "the first snow", "a quiet library"};
    return fmt::format("Request {}-{}-{}: write a short paragraph about {} and what happened on day {} of the "
                       "long journey north.",
                       level, client, k, subjects[(client + k) % 8], client * 7 + k);
}

struct Target {
    std::string base, path_prefix;
};

Target parse_url(const std::string& url) {
    static const std::regex re(R"(^(https?://[^/]+)(/.*)?$)");
    std::smatch m;
    if (!std::regex_match(url, m, re))
        throw Error(Code::InvalidRequest, "--url must look like http://HOST:PORT, got '" + url + "'");
    std::string prefix = m[2].matched ? m[2].str() : "";
    while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
    return {m[1].str(), prefix};
}

// One request's outcome: an error, or its completion tokens, latency and
// (streamed) the time its first text arrived.
struct Outcome {
    std::string error;
    uint64_t tokens = 0;
    double latency_s = 0, ttft_s = -1;
    uint64_t prompt_tokens = 0, cached_tokens = 0;  // streamed: the usage chunk's
};

Outcome plain_request(httplib::Client& cli, const std::string& path, const nlohmann::json& body) {
    Outcome o;
    const auto s = Clock::now();
    auto r = cli.Post(path, body.dump(), "application/json");
    o.latency_s = std::chrono::duration<double>(Clock::now() - s).count();
    if (!r) o.error = httplib::to_string(r.error());
    else if (r->status != 200) o.error = fmt::format("HTTP {}: {}", r->status, r->body.substr(0, 200));
    else {
        try {
            o.tokens = nlohmann::json::parse(r->body).at("usage").at("completion_tokens").get<uint64_t>();
        } catch (const std::exception& e) {
            o.error = std::string("unreadable answer: ") + e.what();
        }
    }
    return o;
}

// Server-sent events: `data: {chunk}` frames, a usage chunk (include_usage),
// then `data: [DONE]`. The first chunk with non-empty text is the first token.
Outcome streamed_request(httplib::Client& cli, const std::string& path, nlohmann::json body) {
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    Outcome o;
    std::string pending, raw;
    bool done = false;
    const auto s = Clock::now();
    auto frame = [&](std::string_view f) {
        if (f.rfind("data: ", 0) != 0) return;
        f.remove_prefix(6);
        if (f == "[DONE]") {
            done = true;
            return;
        }
        try {
            const auto j = nlohmann::json::parse(f);
            if (j.contains("error")) {
                if (o.error.empty()) o.error = "error event: " + j["error"].dump().substr(0, 200);
                return;
            }
            if (o.ttft_s < 0 && j.contains("choices"))
                for (const auto& c : j["choices"])
                    if (c.contains("text") && c["text"].is_string() && !c["text"].get_ref<const std::string&>().empty())
                        o.ttft_s = std::chrono::duration<double>(Clock::now() - s).count();
            if (j.contains("usage") && j["usage"].is_object()) {
                const auto& u = j["usage"];
                o.tokens = u.at("completion_tokens").get<uint64_t>();
                o.prompt_tokens = u.value("prompt_tokens", uint64_t(0));
                if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object())
                    o.cached_tokens = u["prompt_tokens_details"].value("cached_tokens", uint64_t(0));
            }
        } catch (const std::exception& e) {
            if (o.error.empty()) o.error = std::string("unreadable chunk: ") + e.what();
        }
    };
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
        if (raw.size() < 4096) raw.append(data, std::min<size_t>(n, 4096 - raw.size()));
        pending.append(data, n);
        for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
            frame(std::string_view(pending).substr(0, end));
            pending.erase(0, end + 2);
        }
        return true;
    };
    auto r = cli.send(req);
    o.latency_s = std::chrono::duration<double>(Clock::now() - s).count();
    if (!r) o.error = httplib::to_string(r.error());
    else if (r->status != 200) o.error = fmt::format("HTTP {}: {}", r->status, raw.substr(0, 200));
    else if (o.error.empty() && !done) o.error = "the stream ended without [DONE]";
    else if (o.error.empty() && o.tokens == 0) o.error = "the stream carried no usage chunk";
    return o;
}

}  // namespace

std::vector<LevelResult> run_load(const LoadOptions& o) {
    const Target t = parse_url(o.url);
    {
        httplib::Client probe(t.base);
        probe.set_connection_timeout(5, 0);
        auto r = probe.Get(t.path_prefix + "/health");
        if (!r) throw Error(Code::NotFound, "cannot reach " + o.url + "/health: " + httplib::to_string(r.error()));
    }
    const bool stream = o.stream || o.chat;
    std::vector<std::string> models;  // client c sends models[c % n]
    for (size_t at = 0; !o.model.empty();) {
        const size_t comma = o.model.find(',', at);
        models.push_back(o.model.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
        if (models.back().empty()) throw Error(Code::InvalidRequest, "loadgen: an empty name in the model list '" + o.model + "'");
        if (comma == std::string::npos) break;
        at = comma + 1;
    }
    const std::string preamble = o.chat ? chat_preamble(o.workload) : std::string();
    std::vector<LevelResult> out;
    for (size_t level_index = 0; level_index < o.levels.size(); ++level_index) {
        const uint32_t level = o.levels[level_index];
        LevelResult lr;
        lr.clients = level;
        lr.chat = o.chat;
        std::mutex mu;
        std::vector<double> latencies, ttfts, tpots;
        const auto t0 = Clock::now();
        std::vector<std::thread> clients;
        for (uint32_t c = 0; c < level; ++c)
            clients.emplace_back([&, c] {
                httplib::Client cli(t.base);
                cli.set_read_timeout(time_t(o.timeout_s), 0);
                cli.set_write_timeout(30, 0);
                for (uint32_t k = 0; k < o.requests_per_client; ++k) {
                    nlohmann::json body = o.extra;
                    ChatRequest q;
                    if (o.chat) {
                        // Keyed by the level's place and size: runs of one seed with other
                        // --levels send other prompts.
                        q = chat_request(o.workload, preamble, uint32_t(level_index << 16 | level),
                                         c * o.requests_per_client + k);
                        body["prompt"] = std::move(q.prompt);
                        body["max_tokens"] = q.max_tokens;
                    } else {
                        body["prompt"] = prompt_for(level, c, k);
                        body["max_tokens"] = o.max_tokens;
                    }
                    body["temperature"] = 0;
                    body["ignore_eos"] = o.ignore_eos;
                    if (!models.empty()) body["model"] = models[c % models.size()];
                    const std::string path = t.path_prefix + "/v1/completions";
                    const Outcome r = stream ? streamed_request(cli, path, body) : plain_request(cli, path, body);
                    std::lock_guard lock(mu);
                    ++lr.requests;
                    if (!r.error.empty()) {
                        ++lr.failed;
                        if (lr.first_error.empty()) lr.first_error = r.error;
                        continue;
                    }
                    lr.completion_tokens += r.tokens;
                    lr.prompt_tokens += r.prompt_tokens;
                    lr.cached_prompt_tokens += r.cached_tokens;
                    lr.shared_prefix_requests += q.shared ? 1 : 0;
                    latencies.push_back(r.latency_s);
                    if (r.ttft_s >= 0) {
                        ttfts.push_back(r.ttft_s);
                        if (r.tokens >= 2) tpots.push_back((r.latency_s - r.ttft_s) / double(r.tokens - 1));
                    }
                }
            });
        for (auto& th : clients) th.join();
        lr.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
        lr.tokens_per_s = lr.seconds > 0 ? double(lr.completion_tokens) / lr.seconds : 0;
        lr.requests_per_s = lr.seconds > 0 ? double(lr.requests - lr.failed) / lr.seconds : 0;
        lr.latency_p50_s = percentile(latencies, 50);
        lr.latency_p95_s = percentile(latencies, 95);
        lr.latency_p99_s = percentile(latencies, 99);
        lr.streamed = stream;
        lr.ttft_p50_s = percentile(ttfts, 50);
        lr.ttft_p95_s = percentile(ttfts, 95);
        lr.ttft_p99_s = percentile(ttfts, 99);
        lr.tpot_p50_s = percentile(tpots, 50);
        lr.tpot_p95_s = percentile(tpots, 95);
        lr.tpot_p99_s = percentile(tpots, 99);
        if (o.log)
            o.log(fmt::format("{} clients: {:.1f} tok/s, {} requests, {} failed", level, lr.tokens_per_s, lr.requests,
                              lr.failed));
        out.push_back(lr);
    }
    return out;
}

std::string to_table(const std::vector<LevelResult>& r) {
    const bool streamed = !r.empty() && r.front().streamed;
    std::string s = fmt::format("{:>8} {:>9} {:>7} {:>12} {:>10} {:>10} {:>10}", "clients", "requests", "failed",
                                "tokens/s", "req/s", "p50 s", "p95 s");
    if (streamed)
        s += fmt::format(" {:>13} {:>13} {:>13} {:>13} {:>13}", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms",
                         "TPOT p95 ms", "TPOT p99 ms");
    s += "\n";
    for (const auto& l : r) {
        s += fmt::format("{:>8} {:>9} {:>7} {:>12.1f} {:>10.2f} {:>10.3f} {:>10.3f}", l.clients, l.requests, l.failed,
                         l.tokens_per_s, l.requests_per_s, l.latency_p50_s, l.latency_p95_s);
        if (streamed)
            s += fmt::format(" {:>13.2f} {:>13.2f} {:>13.4f} {:>13.4f} {:>13.4f}", l.ttft_p50_s * 1e3,
                             l.ttft_p99_s * 1e3, l.tpot_p50_s * 1e3, l.tpot_p95_s * 1e3, l.tpot_p99_s * 1e3);
        s += "\n";
    }
    for (const auto& l : r)
        if (l.chat)
            s += fmt::format("{} clients: {} prompt tokens, {} of them reused from the prefix cache; {} requests began "
                             "with the preamble\n",
                             l.clients, l.prompt_tokens, l.cached_prompt_tokens, l.shared_prefix_requests);
    for (const auto& l : r)
        if (!l.first_error.empty()) s += fmt::format("{} clients, first error: {}\n", l.clients, l.first_error);
    return s;
}

nlohmann::json to_json(const std::vector<LevelResult>& r, const LoadOptions& o) {
    nlohmann::json levels = nlohmann::json::array();
    for (const auto& l : r) {
        nlohmann::json j = {{"clients", l.clients}, {"requests", l.requests}, {"failed", l.failed},
                            {"completion_tokens", l.completion_tokens}, {"seconds", l.seconds},
                            {"tokens_per_s", l.tokens_per_s}, {"requests_per_s", l.requests_per_s},
                            {"latency_p50_s", l.latency_p50_s}, {"latency_p95_s", l.latency_p95_s},
                            {"latency_p99_s", l.latency_p99_s}, {"first_error", l.first_error}};
        if (l.streamed) {
            j["ttft_p50_s"] = l.ttft_p50_s;
            j["ttft_p95_s"] = l.ttft_p95_s;
            j["ttft_p99_s"] = l.ttft_p99_s;
            j["tpot_p50_s"] = l.tpot_p50_s;
            j["tpot_p95_s"] = l.tpot_p95_s;
            j["tpot_p99_s"] = l.tpot_p99_s;
        }
        if (l.chat) {
            j["prompt_tokens"] = l.prompt_tokens;
            j["cached_prompt_tokens"] = l.cached_prompt_tokens;
            j["shared_prefix_requests"] = l.shared_prefix_requests;
        }
        levels.push_back(std::move(j));
    }
    nlohmann::json out = {{"workload", o.chat ? "chat" : "fixed"}, {"levels", levels}};
    if (o.chat) {
        const ChatWorkload& w = o.workload;
        out["chat"] = {{"seed", w.seed}, {"prompt_words", {w.prompt_words_min, w.prompt_words_max}},
                       {"preamble_words", w.preamble_words}, {"shared_prefix", w.shared_prefix},
                       {"answer_tokens", {w.answer_tokens_min, w.answer_tokens_max}},
                       {"ignore_eos", o.ignore_eos}, {"requests_per_client", o.requests_per_client}};
    }
    return out;
}

}  // namespace eh::tools
