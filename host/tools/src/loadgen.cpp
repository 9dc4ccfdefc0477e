#include "eh/tools/loadgen.hpp"

#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <regex>
#include <thread>

#include "eh/error.hpp"
#include "eh/tools/bench.hpp"

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

}  // namespace

std::vector<LevelResult> run_load(const LoadOptions& o) {
    const Target t = parse_url(o.url);
    {
        httplib::Client probe(t.base);
        probe.set_connection_timeout(5, 0);
        auto r = probe.Get(t.path_prefix + "/health");
        if (!r) throw Error(Code::NotFound, "cannot reach " + o.url + "/health: " + httplib::to_string(r.error()));
    }
    std::vector<LevelResult> out;
    for (uint32_t level : o.levels) {
        LevelResult lr;
        lr.clients = level;
        std::mutex mu;
        std::vector<double> latencies;
        const auto t0 = Clock::now();
        std::vector<std::thread> clients;
        for (uint32_t c = 0; c < level; ++c)
            clients.emplace_back([&, c] {
                httplib::Client cli(t.base);
                cli.set_read_timeout(time_t(o.timeout_s), 0);
                cli.set_write_timeout(30, 0);
                for (uint32_t k = 0; k < o.requests_per_client; ++k) {
                    nlohmann::json body = {{"prompt", prompt_for(level, c, k)}, {"max_tokens", o.max_tokens},
                                           {"temperature", 0}, {"ignore_eos", o.ignore_eos}};
                    if (!o.model.empty()) body["model"] = o.model;
                    const auto s = Clock::now();
                    auto r = cli.Post(t.path_prefix + "/v1/completions", body.dump(), "application/json");
                    const double secs = std::chrono::duration<double>(Clock::now() - s).count();
                    std::lock_guard lock(mu);
                    ++lr.requests;
                    std::string err;
                    uint64_t tokens = 0;
                    if (!r) err = httplib::to_string(r.error());
                    else if (r->status != 200) err = fmt::format("HTTP {}: {}", r->status, r->body.substr(0, 200));
                    else {
                        try {
                            tokens = nlohmann::json::parse(r->body).at("usage").at("completion_tokens").get<uint64_t>();
                        } catch (const std::exception& e) {
                            err = std::string("unreadable answer: ") + e.what();
                        }
                    }
                    if (!err.empty()) {
                        ++lr.failed;
                        if (lr.first_error.empty()) lr.first_error = err;
                        continue;
                    }
                    lr.completion_tokens += tokens;
                    latencies.push_back(secs);
                }
            });
        for (auto& th : clients) th.join();
        lr.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
        lr.tokens_per_s = lr.seconds > 0 ? double(lr.completion_tokens) / lr.seconds : 0;
        lr.requests_per_s = lr.seconds > 0 ? double(lr.requests - lr.failed) / lr.seconds : 0;
        lr.latency_p50_s = percentile(latencies, 50);
        lr.latency_p95_s = percentile(latencies, 95);
        if (o.log)
            o.log(fmt::format("{} clients: {:.1f} tok/s, {} requests, {} failed", level, lr.tokens_per_s, lr.requests,
                              lr.failed));
        out.push_back(lr);
    }
    return out;
}

std::string to_table(const std::vector<LevelResult>& r) {
    std::string s = fmt::format("{:>8} {:>9} {:>7} {:>12} {:>10} {:>10} {:>10}\n", "clients", "requests", "failed",
                                "tokens/s", "req/s", "p50 s", "p95 s");
    for (const auto& l : r)
        s += fmt::format("{:>8} {:>9} {:>7} {:>12.1f} {:>10.2f} {:>10.3f} {:>10.3f}\n", l.clients, l.requests, l.failed,
                         l.tokens_per_s, l.requests_per_s, l.latency_p50_s, l.latency_p95_s);
    for (const auto& l : r)
        if (!l.first_error.empty()) s += fmt::format("{} clients, first error: {}\n", l.clients, l.first_error);
    return s;
}

nlohmann::json to_json(const std::vector<LevelResult>& r) {
    nlohmann::json levels = nlohmann::json::array();
    for (const auto& l : r)
        levels.push_back({{"clients", l.clients}, {"requests", l.requests}, {"failed", l.failed},
                          {"completion_tokens", l.completion_tokens}, {"seconds", l.seconds},
                          {"tokens_per_s", l.tokens_per_s}, {"requests_per_s", l.requests_per_s},
                          {"latency_p50_s", l.latency_p50_s}, {"latency_p95_s", l.latency_p95_s},
                          {"first_error", l.first_error}});
    return {{"levels", levels}};
}

}  // namespace eh::tools
