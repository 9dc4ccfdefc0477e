#include "eh/http/server.hpp"

#include <fmt/format.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <set>
#include <thread>

#include "eh/service/event_log.hpp"
#include "eh/service/utf8.hpp"
#include "anthropic_api.hpp"
#include "auth.hpp"
#include "crash_notice.hpp"
#include "impl.hpp"
#include "pooled_api.hpp"
#include "request_guard.hpp"
#include "responses_api.hpp"

namespace eh::http {
namespace {

const std::set<std::string> kRoutes = {"/health", "/health/live", "/health/ready", "/capabilities", "/metrics", "/execute", "/cancel", "/tokenize",
                                       "/detokenize", "/shutdown", "/v1/models", "/v1/completions",
                                       "/v1/chat/completions", "/v1/capabilities", "/v1/messages",
                                       "/v1/messages/count_tokens", "/v1/responses", "/v1/models/load",
                                       "/v1/models/unload", "/models/load", "/models/unload", "/v1/embeddings",
                                       "/v1/rerank", "/rerank"};

// Why `host`:`port` cannot be listened on, in words: httplib only says that
// it failed, so the bind is tried once more here (with the listener's
// SO_REUSEADDR) for bind(2)'s reason.
std::string bind_problem(const std::string& host, int port) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo* found = nullptr;
    if (int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0)
        return fmt::format("cannot resolve {} ({})", host, ::gai_strerror(rc));
    int err = 0;
    for (addrinfo* a = found; a; a = a->ai_next) {
        int s = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (s < 0) {
            err = errno;
            continue;
        }
        int yes = 1;
        ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
        const bool bound = ::bind(s, a->ai_addr, a->ai_addrlen) == 0;
        err = bound ? 0 : errno;
        ::close(s);
        if (bound) break;
    }
    ::freeaddrinfo(found);
    switch (err) {
    case EADDRINUSE: return fmt::format("port {} is in use (another process is listening on it)", port);
    case EADDRNOTAVAIL: return fmt::format("{} is not an address of this machine", host);
    case EACCES: return fmt::format("permission denied (port {} needs privileges)", port);
    case 0: return "the bind failed";  // free again by now
    default: return std::strerror(err);
    }
}

}  // namespace

Server::Server(ServerOptions options, std::shared_ptr<service::Metrics> metrics) : impl_(std::make_unique<Impl>()) {
    impl_->options = std::move(options);
    impl_->metrics = metrics ? std::move(metrics) : std::make_shared<service::Metrics>();
    impl_->started_unix = unix_now();
    // Connections are read by the gate (connection.hpp): one thread each, up
    // to its cap, with the body limit enforced while reading.
    impl_->http.limits.framing.max_body_bytes = impl_->options.limits.max_body_bytes;
    impl_->http.set_payload_max_length(impl_->options.limits.max_body_bytes);
    impl_->http.limits.max_connections_per_client = impl_->options.max_connections_per_client;
    impl_->http.on_refused = [m = impl_->metrics](int status) { m->http_response("other", status); };
    // Only the keys' digests are kept.
    impl_->keys = ApiKeys(impl_->options.api_keys);
    impl_->options.api_keys.clear();
    if (!impl_->options.artifacts_dir.empty()) {
        impl_->artifacts = std::make_unique<ArtifactStore>(impl_->options.artifacts_dir, impl_->options.artifacts_max_files,
                                                           impl_->options.artifacts_max_transcript_bytes);
        if (!impl_->options.model_path.empty()) impl_->model_digest = std::make_unique<FileDigest>(impl_->options.model_path);
    }
    impl_->install_gates();
    impl_->install_health();
    install_web_page(*impl_);
    impl_->install_native();
    impl_->install_openai();
    impl_->install_anthropic();
    impl_->install_lifecycle();
    impl_->install_models();
    install_responses(*impl_);
    install_pooled(*impl_);
}

Server::~Server() { stop(); }

int Server::bind() {
    if (!impl_->options.ssl_cert_file.empty() || !impl_->options.ssl_key_file.empty()) {
        if (impl_->options.ssl_cert_file.empty() || impl_->options.ssl_key_file.empty())
            throw Error(Code::InvalidRequest, "HTTPS needs both --ssl-cert-file and --ssl-key-file");
        impl_->http.use_tls(impl_->options.ssl_cert_file, impl_->options.ssl_key_file);
    }
    if (impl_->options.port == 0) {
        port_ = impl_->http.bind_to_any_port(impl_->options.host);
        if (port_ <= 0) throw Error(Code::Internal, fmt::format("cannot bind to {} on any port", impl_->options.host));
    } else {
        if (!impl_->http.bind_to_port(impl_->options.host, impl_->options.port))
            throw Error(Code::Internal, fmt::format("cannot listen on {}:{}: {}", impl_->options.host, impl_->options.port,
                                                    bind_problem(impl_->options.host, impl_->options.port)));
        port_ = impl_->options.port;
    }
    impl_->http.widen_backlog(SOMAXCONN);
    return port_;
}

void Server::run() {
    crash_notice::install();
    impl_->in_run.store(true);
    if (!impl_->stop_requested.load()) impl_->http.listen_after_bind();
    impl_->in_run.store(false);
}

void Server::stop() {
    if (!impl_) return;
    impl_->stop_requested.store(true);
    impl_->http.abort_reads();
    // listen_after_bind() may not be listening yet: keep asking until run()
    // has returned (or never began).
    bool asked = false;
    while (impl_->in_run.load()) {
        if (!asked && impl_->http.is_running()) {
            impl_->http.stop();
            asked = true;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
}

void Server::set_load_progress(float f) { impl_->load_progress.store(f); }

void Server::attach(std::shared_ptr<service::Service> svc, NodeInfo info) {
    {
        std::lock_guard lock(impl_->mu);
        impl_->service = std::move(svc);
        impl_->info = std::move(info);
    }
    impl_->loaded();
}

void Server::attach_pool(std::shared_ptr<ModelPool> pool, NodeInfo info) {
    {
        std::lock_guard lock(impl_->mu);
        impl_->pool_ = std::move(pool);
        impl_->info = std::move(info);
    }
    impl_->loaded();
}

void Server::set_resident(bool resident, const std::string& why) {
    std::lock_guard lock(impl_->mu);
    impl_->resident = resident;
    impl_->resident_why = why;
}

void Server::begin_shutdown() {
    impl_->state.store(State::Stopping);
    impl_->http.begin_drain();
}

void Server::drain(std::chrono::milliseconds timeout) {
    auto until = std::chrono::steady_clock::now() + timeout;
    while (impl_->open_streams.load() > 0 && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

void Server::on_shutdown_request(std::function<void()> fn) {
    std::lock_guard lock(impl_->mu);
    impl_->shutdown_fn = std::move(fn);
}

// What every request passes before and after its route: the Host check
// (DNS rebinding), CORS, the API key; the response count per route; the
// error bodies of httplib's own refusals and of exceptions.
void Server::Impl::install_gates() {
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
        // DNS rebinding: a page on evil.example whose name now resolves to
        // 127.0.0.1 sends Host: evil.example. (HTTP/1.0 may omit Host; a
        // browser never does.)
        const std::string host = req.get_header_value("Host");
        if (!(host.empty() && req.version == "HTTP/1.0") && !host_allowed(host, options.host, options.allowed_hosts)) {
            send_error(res, 403, "INVALID_REQUEST",
                       fmt::format("Host '{}' is not allowed here (IP addresses, localhost and the bound host are; "
                                   "add names with --allowed-hosts)",
                                   service::sanitize_utf8(host.substr(0, 200))),
                       correlation_id(req, res));
            return httplib::Server::HandlerResponse::Handled;
        }
        if (options.cors) {
            std::string origin = req.get_header_value("Origin");
            if (!origin.empty() && local_origin(origin)) {
                res.set_header("Access-Control-Allow-Origin", origin);
                res.set_header("Vary", "Origin");
                res.set_header("Access-Control-Expose-Headers", "X-Correlation-Id, Retry-After");
                if (req.method == "OPTIONS") {
                    res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
                    res.set_header("Access-Control-Allow-Headers", "Content-Type, Authorization, X-Api-Key, X-Correlation-Id");
                    res.set_header("Access-Control-Max-Age", "600");
                    res.status = 204;
                    return httplib::Server::HandlerResponse::Handled;
                }
            }
        }
        // Two Authorization (or, on /v1/messages, x-api-key) headers: which
        // one counts is a guess a proxy in front may make differently.
        if (std::string why = credential_header_problem(req, req.path.rfind("/v1/messages", 0) == 0); !why.empty()) {
            send_error(res, 400, "INVALID_REQUEST", why, correlation_id(req, res));
            return httplib::Server::HandlerResponse::Handled;
        }
        if (keys.required() && route_needs_key(req.method, req.path, options.metrics_require_key)) {
            // After the CORS headers, so a browser tool can read the 401.
            const bool anthropic = req.path.rfind("/v1/messages", 0) == 0;
            const std::string key = request_key(req);
            if (!keys.accepts(key)) {
                const std::string cid = correlation_id(req, res);
                const std::string message = key.empty()
                    ? (anthropic ? "no API key: send x-api-key: KEY or Authorization: Bearer KEY"
                                 : "no API key: send Authorization: Bearer KEY")
                    : "invalid API key";
                res.set_header("WWW-Authenticate", "Bearer");
                if (anthropic) send_anthropic_error(res, 401, message);
                else send_error(res, 401, "INVALID_API_KEY", message, cid);
                return httplib::Server::HandlerResponse::Handled;
            }
        }
        return httplib::Server::HandlerResponse::Unhandled;
    });
    http.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
        metrics->http_response(kRoutes.count(req.path) ? req.path : "other", res.status);
    });
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return;
        std::string cid = correlation_id(req, res);
        if (res.status == 413) {
            send_error(res, 413, "INVALID_REQUEST",
                       fmt::format("the request body is larger than the limit of {} bytes", options.limits.max_body_bytes),
                       cid, {{"limit_bytes", options.limits.max_body_bytes}});
        } else if (res.status == 404) {
            send_error(res, 404, "NOT_FOUND",
                       fmt::format("no route {} {}", req.method, service::sanitize_utf8(req.path.substr(0, 200))), cid);
        } else if (res.status == 405) {
            send_error(res, 405, "INVALID_REQUEST", fmt::format("method {} not allowed here", req.method), cid);
        } else {
            int st = res.status;
            send_error(res, st, st >= 500 ? "INTERNAL" : "INVALID_REQUEST", fmt::format("HTTP {}", st), cid);
        }
    });
    http.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string cid = correlation_id(req, res);
        try {
            if (ep) std::rethrow_exception(ep);
            send_error(res, 500, "INTERNAL", "unknown error", cid);
        } catch (const std::exception& e) {
            send_exception(res, e, cid);
        } catch (...) {
            send_error(res, 500, "INTERNAL", "unknown error", cid);
        }
    });
}

}  // namespace eh::http
