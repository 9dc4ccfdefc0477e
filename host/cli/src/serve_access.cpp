#include "serve_access.hpp"

#include <fmt/format.h>

#include <cstdlib>

#include "eh/error.hpp"
#include "eh/regular_file.hpp"
#include "eh/http/api_keys.hpp"

namespace eh::cli {
namespace {

// The largest certificate or key file read (docs/http-api.md, "HTTPS"; the
// server's own reading has the same cap).
constexpr size_t kMaxTlsFileBytes = size_t(1) << 20;

}  // namespace

void add_serve_access_options(po::options_description& desc) {
    desc.add_options()
        ("api-key", po::value<std::vector<std::string>>(),
         "require this API key (repeatable; also $ENGINE_HOST_API_KEY and --api-key-file): "
         "Authorization: Bearer KEY on every route but /health, /metrics and the chat page")
        ("api-key-file", po::value<std::vector<std::string>>(),
         "file of API keys, one a line ('#' comments and blank lines skipped; repeatable)")
        ("metrics-require-key", "with API keys, /metrics needs one too")
        ("ssl-cert-file", po::value<std::string>(), "serve HTTPS with this PEM certificate (chain); needs --ssl-key-file")
        ("ssl-key-file", po::value<std::string>(), "PEM private key for --ssl-cert-file")
        ("max-body-bytes", po::value<size_t>()->default_value(service::RequestLimits{}.max_body_bytes),
         "largest request body, after de-chunking and decompression (1024-268435456; 413 past it)")
        ("max-prompt-chars", po::value<size_t>()->default_value(service::RequestLimits{}.max_prompt_chars),
         "longest prompt or rendered chat, in Unicode code points (0-16777216; 400 past it); 0: no cap of its own "
         "(--max-body-bytes bounds the text, the context the prompt's tokens)")
        ("max-connections-per-client", po::value<size_t>()->default_value(http::ServerOptions{}.max_connections_per_client),
         "connections one client address (IPv4, or IPv6 /64) may hold at once (1-65536; 429 past it); a reverse "
         "proxy on the same machine counts as one client");
}

bool apply_serve_access_options(const po::variables_map& vm, http::ServerOptions& so, std::string& err) {
    // Every key given is checked, an empty one included: a key that is
    // empty by mistake must not start a server that takes no key at all.
    // The messages never hold the key itself.
    std::vector<std::string> keys;
    if (vm.count("api-key")) keys = vm["api-key"].as<std::vector<std::string>>();
    for (const auto& k : keys) {
        if (std::string why = http::key_problem(k); !why.empty()) {
            err = "--api-key: " + why;
            return false;
        }
    }
    if (const char* env = std::getenv(kApiKeyEnv)) {  // set, even to nothing
        if (std::string why = http::key_problem(env); !why.empty()) {
            err = "$" + std::string(kApiKeyEnv) + ": " + why + (*env ? "" : " (unset the variable to serve without a key)");
            return false;
        }
        keys.emplace_back(env);
    }
    if (vm.count("api-key-file")) {
        try {
            for (const auto& path : vm["api-key-file"].as<std::vector<std::string>>())
                for (auto& k : http::read_api_key_file(path)) keys.push_back(std::move(k));
        } catch (const Error& e) {
            err = e.what();
            return false;
        }
    }
    so.api_keys = std::move(keys);
    so.metrics_require_key = vm.count("metrics-require-key") > 0;
    if (so.metrics_require_key && so.api_keys.empty()) {
        err = "--metrics-require-key needs an API key (--api-key, --api-key-file or $" + std::string(kApiKeyEnv) + ")";
        return false;
    }
    if (vm.count("ssl-cert-file") != vm.count("ssl-key-file")) {
        err = "HTTPS needs both --ssl-cert-file and --ssl-key-file";
        return false;
    }
    if (vm.count("ssl-cert-file")) {
        so.ssl_cert_file = vm["ssl-cert-file"].as<std::string>();
        so.ssl_key_file = vm["ssl-key-file"].as<std::string>();
        // Regular files only, checked before anything opens them for good: a
        // FIFO would block startup in open(), deaf to SIGTERM. What they hold
        // is checked when the server binds (Server::bind).
        const std::pair<const char*, std::string> files[] = {{"--ssl-cert-file", so.ssl_cert_file},
                                                             {"--ssl-key-file", so.ssl_key_file}};
        for (const auto& [flag, path] : files) {
            std::string problem;
            if (!read_regular_file(path, kMaxTlsFileBytes, problem)) {
                err = std::string(flag) + ": " + problem;
                return false;
            }
        }
    }
    const size_t body = vm["max-body-bytes"].as<size_t>();
    if (body < 1024 || body > (size_t(256) << 20)) {
        err = "--max-body-bytes must be between 1024 and 268435456";
        return false;
    }
    const size_t chars = vm["max-prompt-chars"].as<size_t>();
    if (chars > (size_t(1) << 24)) {
        err = "--max-prompt-chars must be between 0 and 16777216";
        return false;
    }
    so.limits.max_body_bytes = body;
    so.limits.max_prompt_chars = chars;
    const size_t per_client = vm["max-connections-per-client"].as<size_t>();
    if (per_client < 1 || per_client > 65536) {
        err = "--max-connections-per-client must be between 1 and 65536";
        return false;
    }
    so.max_connections_per_client = per_client;
    return true;
}

}  // namespace eh::cli
