#include "connection.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstdio>
#include <system_error>
#include <cstring>
#include <optional>

#include "eh/regular_file.hpp"
#include "access_log.hpp"
#include "crash_notice.hpp"
#include "impl.hpp"
#include "request_guard.hpp"

namespace eh::http {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kSliceMs = 50;  // how often a waiting read looks at the stop flags

const char* reason_phrase(int status) {
    switch (status) {
    case 100: return "Continue";
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
    }
}

// The address a connection's per-client count is kept under: IPv4 (an
// IPv4-mapped IPv6 peer too) by its address, IPv6 by its /64, since one host
// usually holds a whole /64. Empty when the peer has no IP address.
std::string client_address(int fd) {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "";
    char buf[INET6_ADDRSTRLEN] = {};
    if (a.ss_family == AF_INET) {
        ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&a)->sin_addr, buf, sizeof buf);
        return buf;
    }
    if (a.ss_family != AF_INET6) return "";
    in6_addr addr = reinterpret_cast<sockaddr_in6*>(&a)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&addr)) {
        in_addr v4;
        std::memcpy(&v4, addr.s6_addr + 12, 4);
        ::inet_ntop(AF_INET, &v4, buf, sizeof buf);
        return buf;
    }
    std::memset(addr.s6_addr + 8, 0, 8);
    ::inet_ntop(AF_INET6, &addr, buf, sizeof buf);
    return std::string(buf) + "/64";
}

// Reads and drops what the peer already sent, without waiting: closing a
// socket with unread bytes makes the kernel send a reset, which can destroy
// an answer the client has not read yet.
void drop_unread(int fd) {
    char sink[16384];
    for (size_t dropped = 0; dropped < (size_t(1) << 20);) {
        ssize_t n = ::recv(fd, sink, sizeof sink, MSG_DONTWAIT);
        if (n <= 0) break;
        dropped += size_t(n);
    }
}

}  // namespace

// The bytes of one connection: the socket itself, or TLS over it (then the
// socket is non-blocking and OpenSSL may need to read to write or the other
// way round; wants() says which to poll for).
class Transport {
public:
    explicit Transport(int fd, SSL* ssl = nullptr) : fd_(fd), ssl_(ssl) {}
    ~Transport() {
        if (ssl_) SSL_free(ssl_);
    }
    Transport(const Transport&) = delete;
    Transport& operator=(const Transport&) = delete;
    int fd() const { return fd_; }
    bool tls() const { return ssl_ != nullptr; }
    short wants() const { return wants_; }
    // Decrypted bytes not handed out yet: poll() cannot see them.
    bool buffered() const { return ssl_ && SSL_pending(ssl_) > 0; }
    // As recv()/send(): > 0 bytes, 0 the peer closed, -1 with errno (EAGAIN: poll for wants(), then again).
    ssize_t recv(char* p, size_t n) {
        wants_ = POLLIN;
        if (!ssl_) return ::recv(fd_, p, n, 0);
        return tls_result(SSL_read(ssl_, p, int(std::min<size_t>(n, 1 << 30))));
    }
    ssize_t send(const char* p, size_t n) {
        wants_ = POLLOUT;
        if (!ssl_) return ::send(fd_, p, n, MSG_NOSIGNAL);
        return tls_result(SSL_write(ssl_, p, int(std::min<size_t>(n, 1 << 30))));
    }
    // Sends TLS's close_notify (best effort) before the socket is shut.
    void close_notify() {
        if (ssl_) SSL_shutdown(ssl_);
    }

private:
    ssize_t tls_result(int rc) {
        if (rc > 0) return rc;
        switch (SSL_get_error(ssl_, rc)) {
        case SSL_ERROR_WANT_READ: wants_ = POLLIN; errno = EAGAIN; return -1;
        case SSL_ERROR_WANT_WRITE: wants_ = POLLOUT; errno = EAGAIN; return -1;
        case SSL_ERROR_ZERO_RETURN: return 0;
        default: ERR_clear_error(); errno = ECONNRESET; return -1;
        }
    }
    int fd_;
    SSL* ssl_;
    short wants_ = POLLIN;
};

namespace {

// Waits (up to `ms`) until `t` can make progress in the direction it last wanted.
bool wait_for(Transport& t, short events, int ms) {
    if (events == POLLIN && t.buffered()) return true;
    pollfd p{t.fd(), events, 0};
    return ::poll(&p, 1, ms) > 0;
}

bool send_all(Transport& t, std::string_view s, std::chrono::milliseconds timeout) {
    const auto until = Clock::now() + timeout;
    short want = POLLOUT;
    while (!s.empty()) {
        int left = int(std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count());
        if (left <= 0 || !wait_for(t, want, left)) return false;
        ssize_t n = t.send(s.data(), s.size());
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
            want = t.wants();
            continue;
        }
        if (n <= 0) return false;
        s.remove_prefix(size_t(n));
        want = POLLOUT;
    }
    return true;
}

// A complete error response; the connection is closed after it, since the
// rest of the request (if any) was not read.
std::string error_response(int status, const std::string& code, const std::string& message, const nlohmann::json& details,
                           bool retry_after, const std::string& cid) {
    std::string body = dump(typed_error_body(status, code, message, cid, details));
    std::string r = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
    r += "Content-Type: application/json\r\nConnection: close\r\nX-Correlation-Id: " + cid + "\r\n";
    if (retry_after) r += "Retry-After: 1\r\n";
    r += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    return r;
}

thread_local int t_client_fd = -1;

// Whether the peer of `fd` is still there (a closed one reads as EOF;
// pipelined bytes waiting to be read do not count as gone).
bool peer_alive(int fd) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) return true;
    char c;
    return ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

// httplib reads the canonical request from memory and writes to the socket.
class CanonicalStream final : public httplib::Stream {
public:
    CanonicalStream(Transport& t, std::string request, std::chrono::milliseconds write_timeout)
        : t_(t), fd_(t.fd()), in_(std::move(request)), write_timeout_(write_timeout) {}

    uint64_t bytes_written() const { return written_; }
    bool is_readable() const override { return pos_ < in_.size(); }
    bool is_writable() const override {
        pollfd p{fd_, POLLOUT, 0};
        if (::poll(&p, 1, int(write_timeout_.count())) <= 0 || (p.revents & (POLLERR | POLLHUP))) return false;
        return alive();
    }
    ssize_t read(char* ptr, size_t size) override {
        size_t n = std::min(size, in_.size() - pos_);
        std::memcpy(ptr, in_.data() + pos_, n);
        pos_ += n;
        return ssize_t(n);
    }
    ssize_t write(const char* ptr, size_t size) override {
        short want = POLLOUT;
        for (;;) {
            if (!wait_for(t_, want, int(write_timeout_.count()))) return -1;
            ssize_t n = t_.send(ptr, size);
            if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
                want = t_.wants();
                continue;
            }
            if (n > 0) {
                written_ += uint64_t(n);
                // Raw bytes cannot be added to a TLS stream: no crash notice there.
                if (!t_.tls()) crash_notice::wrote(fd_, std::string_view(ptr, size_t(n)), size_t(n) == size);
            }
            return n;
        }
    }
    void get_remote_ip_and_port(std::string& ip, int& port) const override { address(true, ip, port); }
    void get_local_ip_and_port(std::string& ip, int& port) const override { address(false, ip, port); }
    socket_t socket() const override { return fd_; }

private:
    bool alive() const { return peer_alive(fd_); }
    void address(bool remote, std::string& ip, int& port) const {
        sockaddr_storage a{};
        socklen_t len = sizeof a;
        int rc = remote ? ::getpeername(fd_, reinterpret_cast<sockaddr*>(&a), &len)
                        : ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
        if (rc != 0) return;
        char buf[INET6_ADDRSTRLEN] = {};
        if (a.ss_family == AF_INET) {
            auto* s = reinterpret_cast<sockaddr_in*>(&a);
            ::inet_ntop(AF_INET, &s->sin_addr, buf, sizeof buf);
            port = ntohs(s->sin_port);
        } else if (a.ss_family == AF_INET6) {
            auto* s = reinterpret_cast<sockaddr_in6*>(&a);
            ::inet_ntop(AF_INET6, &s->sin6_addr, buf, sizeof buf);
            port = ntohs(s->sin6_port);
        }
        ip = buf;
    }

    Transport& t_;
    int fd_;
    std::string in_;
    size_t pos_ = 0;
    std::chrono::milliseconds write_timeout_;
    uint64_t written_ = 0;
};

enum class Read { Ok, Closed, TimedOut, Aborted };

// Appends what the socket has, waiting until `until` in short slices so the
// stop flags are seen.
Read read_more(Transport& t, std::string& buf, Clock::time_point until, const std::atomic<bool>& aborted) {
    short want = POLLIN;
    for (;;) {
        if (aborted.load()) return Read::Aborted;
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
        if (left <= 0) return Read::TimedOut;
        if (!(want == POLLIN && t.buffered())) {
            pollfd p{t.fd(), want, 0};
            int rc = ::poll(&p, 1, int(std::min<int64_t>(left, kSliceMs)));
            if (rc < 0 && errno != EINTR) return Read::Closed;
            if (rc <= 0) continue;
        }
        char chunk[16384];
        ssize_t n = t.recv(chunk, sizeof chunk);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
            want = t.wants();
            continue;
        }
        if (n <= 0) return Read::Closed;
        buf.append(chunk, size_t(n));
        return Read::Ok;
    }
}

// After an error answer the rest of the request is unread; closing now would
// make the kernel send a reset, which can destroy the answer before the
// client reads it. So: end our side, then read and drop what still comes for
// a short while (bounded in bytes and time).
void linger_close(Transport& t) {
    const int fd = t.fd();
    t.close_notify();
    ::shutdown(fd, SHUT_WR);
    const auto until = Clock::now() + std::chrono::milliseconds(500);
    size_t dropped = 0;
    char sink[16384];
    while (dropped < (size_t(8) << 20)) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
        if (left <= 0) break;
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, int(left)) <= 0) break;
        ssize_t n = ::recv(fd, sink, sizeof sink, 0);
        if (n <= 0) break;
        dropped += size_t(n);
    }
}

// The refusals of one connection: the error response, its access-log line
// (the method and path of the request being read, the time since its head
// arrived), the metrics callback, then a lingering close.
struct Refusals {
    Transport& t;
    const std::function<void(int)>& on_refused;
    std::string method = "-", path = "-";
    Clock::time_point head_done = Clock::now();

    // Before a request's head is read: no method or path yet.
    void next_request() {
        method.assign(1, '-');
        path.assign(1, '-');
    }

    void operator()(int status, const std::string& code, const std::string& message, const nlohmann::json& details,
                    bool retry_after = false) {
        if (on_refused) on_refused(status);
        access::Entry e;
        e.method = method;
        e.path = path;
        e.status = status;
        e.correlation_id = new_correlation_id();
        const std::string response = error_response(status, code, message, details, retry_after, e.correlation_id);
        const bool sent = send_all(t, response, std::chrono::milliseconds(1000));
        e.bytes = sent ? response.size() : 0;
        e.total_ms = std::chrono::duration<double, std::milli>(Clock::now() - head_done).count();
        access::write(e);
        if (!sent) return;
        // Not when over the connection cap: a flood must not keep threads.
        if (!retry_after) linger_close(t);
    }

    // A framing error (head, chunks, content coding): its status and
    // message; one over the body limit names the limit.
    void framing(const FramingError& err, size_t max_body_bytes) {
        nlohmann::json details = nlohmann::json::object();
        if (err.status == 413) details["limit_bytes"] = max_body_bytes;
        (*this)(err.status, "INVALID_REQUEST", err.message, details);
    }
};

// Reads and parses the next request's head (up to `until`) from buf and the
// transport, and takes it out of buf; false when the connection is done
// (refused, closed, aborted).
bool read_head(Transport& t, std::string& buf, Clock::time_point until, std::chrono::milliseconds header_timeout,
               const FramingLimits& fl, const std::atomic<bool>& aborted, Refusals& refuse, RequestHead& head) {
    refuse.head_done = Clock::now();
    size_t head_end;
    while ((head_end = buf.find("\r\n\r\n")) == std::string::npos) {
        if (buf.size() > fl.max_head_bytes) {
            refuse(431, "INVALID_REQUEST",
                   "the request head is larger than the limit of " + std::to_string(fl.max_head_bytes) + " bytes",
                   {{"limit_bytes", fl.max_head_bytes}});
            return false;
        }
        Read r = read_more(t, buf, until, aborted);
        if (r == Read::TimedOut)
            refuse(408, "INVALID_REQUEST",
                   "the request head did not arrive within " + std::to_string(header_timeout.count()) + " ms",
                   {{"timeout_ms", header_timeout.count()}});
        if (r != Read::Ok) return false;
    }
    refuse.head_done = Clock::now();
    FramingError err;
    const bool parsed = parse_head(std::string_view(buf).substr(0, head_end), fl, head, err);
    if (!head.method.empty()) refuse.method = head.method.substr(0, 16);
    if (!head.target.empty()) refuse.path = access::log_path(head.target);
    if (!parsed) {
        refuse.framing(err, fl.max_body_bytes);
        return false;
    }
    buf.erase(0, head_end + 4);
    return true;
}

// Every POST body here is JSON. A type a web page may send cross-site
// without a CORS preflight is refused before the body is read
// (request_guard.hpp); a form type from curl -d (no Origin) is read as
// JSON: httplib is not shown it, since it would parse the body as a form
// under its own 8 KiB limit. False when refused.
bool admit_content_type(RequestHead& head, Refusals& refuse) {
    if (head.method != "POST") return true;
    const std::string type = head.header("content-type");
    if (cross_site_form_post(type, !head.header("origin").empty())) {
        refuse(415, "INVALID_REQUEST", "this route takes a JSON body: send Content-Type: application/json", {});
        return false;
    }
    if (form_content_type(type)) head.drop_header("content-type");
    return true;
}

// The body, within the body timeout, de-chunked and inflated under the
// limit, taken out of buf; false when the connection is done.
bool read_body(Transport& t, std::string& buf, const RequestHead& head, const ConnectionLimits& limits,
               const std::atomic<bool>& aborted, Refusals& refuse, std::string& body) {
    const FramingLimits& fl = limits.framing;
    const auto body_until = Clock::now() + limits.body_timeout;
    auto read = [&] {
        Read r = read_more(t, buf, body_until, aborted);
        if (r == Read::TimedOut)
            refuse(408, "INVALID_REQUEST",
                   "the request body did not arrive within " + std::to_string(limits.body_timeout.count()) + " ms",
                   {{"timeout_ms", limits.body_timeout.count()}});
        return r == Read::Ok;
    };
    FramingError err;
    std::string raw;
    if (head.chunked) {
        ChunkedDecoder dec(fl);
        for (;;) {
            size_t used = 0;
            auto st = dec.feed(buf, used, raw, err);
            buf.erase(0, used);
            if (st == ChunkedDecoder::Status::Done) break;
            if (st == ChunkedDecoder::Status::Failed) {
                refuse.framing(err, fl.max_body_bytes);
                return false;
            }
            if (!read()) return false;
        }
    } else {
        while (buf.size() < head.content_length)
            if (!read()) return false;
        raw = buf.substr(0, size_t(head.content_length));
        buf.erase(0, size_t(head.content_length));
    }
    if (!inflate_body(raw, head.coding, fl.max_body_bytes, body, err)) {
        refuse.framing(err, fl.max_body_bytes);
        return false;
    }
    return true;
}

}  // namespace

GatedServer::GatedServer() {
    new_task_queue = [] { return new ConnectionThreads(); };
    // httplib's default sets SO_REUSEPORT, which lets a second process bind
    // the same port and take a share of the connections. SO_REUSEADDR alone
    // still allows a restart while old connections sit in TIME_WAIT, and a
    // second server's bind fails with EADDRINUSE.
    set_socket_options([](socket_t sock) {
        int yes = 1;
        ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    });
    set_keep_alive_max_count(limits.max_requests_per_connection);
    // httplib calls this once the response is written (a stream included):
    // the status and correlation id of the request the gate is serving.
    set_logger([](const httplib::Request& req, const httplib::Response& res) {
        if (auto* scope = access::current()) {
            scope->entry.status = res.status;
            scope->entry.correlation_id = res.get_header_value("X-Correlation-Id");
            access::note_routing(scope->entry, req);
        }
    });
}

GatedServer::~GatedServer() {
    if (tls_) SSL_CTX_free(tls_);
}

void GatedServer::use_tls(const std::string& cert_file, const std::string& key_file) {
    auto fail = [](const std::string& what) {
        unsigned long e = ERR_get_error();
        char reason[256] = "unknown reason";
        if (e) ERR_error_string_n(e, reason, sizeof reason);
        ERR_clear_error();
        throw Error(Code::InvalidRequest, what + " (" + reason + ")");
    };
    // Read as regular files only (a FIFO would block the open, a device the
    // read), then parsed from memory.
    auto read_pem = [](const char* flag, const std::string& path) {
        std::string problem;
        std::optional<std::string> pem = read_regular_file(path, kMaxTlsFileBytes, problem);
        if (!pem) throw Error(Code::InvalidRequest, std::string(flag) + ": " + problem);
        return std::move(*pem);
    };
    const std::string cert_pem = read_pem("--ssl-cert-file", cert_file);
    const std::string key_pem = read_pem("--ssl-key-file", key_file);
    // An encrypted key is refused rather than have OpenSSL prompt on the terminal.
    pem_password_cb* no_password = [](char*, int, int, void*) { return 0; };
    SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) fail("cannot create a TLS context");
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    auto give_up = [&](const std::string& what) {
        SSL_CTX_free(ctx);
        fail(what);
    };
    // The certificate, then the chain behind it.
    ERR_clear_error();
    bool cert_ok = false;
    if (BIO* bio = BIO_new_mem_buf(cert_pem.data(), int(cert_pem.size()))) {
        if (X509* leaf = PEM_read_bio_X509_AUX(bio, nullptr, no_password, nullptr)) {
            cert_ok = SSL_CTX_use_certificate(ctx, leaf) == 1;
            X509_free(leaf);
            while (cert_ok) {
                X509* ca = PEM_read_bio_X509(bio, nullptr, no_password, nullptr);
                if (!ca) break;
                if (SSL_CTX_add0_chain_cert(ctx, ca) != 1) {
                    X509_free(ca);
                    cert_ok = false;
                }
            }
            // The end of the file reads as "no start line"; anything else is a bad chain entry.
            unsigned long e = ERR_peek_last_error();
            if (cert_ok && e && !(ERR_GET_LIB(e) == ERR_LIB_PEM && ERR_GET_REASON(e) == PEM_R_NO_START_LINE))
                cert_ok = false;
            else if (cert_ok)
                ERR_clear_error();
        }
        BIO_free(bio);
    }
    if (!cert_ok) give_up("--ssl-cert-file " + cert_file + ": not a readable PEM certificate");
    // Read first, so an unreadable key and a key for another certificate
    // get different messages.
    EVP_PKEY* key = nullptr;
    if (BIO* bio = BIO_new_mem_buf(key_pem.data(), int(key_pem.size()))) {
        key = PEM_read_bio_PrivateKey(bio, nullptr, no_password, nullptr);
        BIO_free(bio);
    }
    if (!key) give_up("--ssl-key-file " + key_file + ": not a readable PEM private key");
    const bool matches = SSL_CTX_use_PrivateKey(ctx, key) == 1 && SSL_CTX_check_private_key(ctx) == 1;
    EVP_PKEY_free(key);
    if (!matches) give_up("--ssl-key-file " + key_file + " does not match the certificate in " + cert_file);
    if (tls_) SSL_CTX_free(tls_);
    tls_ = ctx;
}

void GatedServer::widen_backlog(int backlog) {
    socket_t s = svr_sock_.load();
    if (s != INVALID_SOCKET) ::listen(s, backlog);  // Linux updates the backlog of a listening socket
}

size_t GatedServer::count_client(const std::string& client, int delta) {
    if (client.empty()) return 0;
    std::lock_guard lock(clients_mu_);
    size_t& n = clients_[client];
    n = delta > 0 ? n + 1 : n - 1;
    const size_t now = n;
    if (now == 0) clients_.erase(client);
    return now;
}

bool GatedServer::process_and_close_socket(socket_t sock) {
    const auto accepted = Clock::now();
    // httplib writes a head and its body (and every SSE event) as separate
    // sends; with Nagle on, a kept-alive connection waits out the peer's
    // delayed ACK (~40 ms) before each body.
    int one = 1;
    ::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    const std::string client = client_address(int(sock));
    const size_t from_client = count_client(client, +1);
    const size_t open = size_t(++open_);
    if (!tls_) {
        Transport t{int(sock)};
        serve(t, open, from_client, accepted);
    } else if (from_client > limits.max_connections_per_client) {
        // Over its client's cap: closed at once. An answer would need a
        // handshake first, the very work a flood wants spent on it.
    } else if (SSL* ssl = SSL_new(tls_)) {
        // Non-blocking, so neither the handshake nor a read can outlast its
        // deadline; the handshake counts against the first request's head
        // timeout.
        ::fcntl(sock, F_SETFL, ::fcntl(sock, F_GETFL) | O_NONBLOCK);
        SSL_set_fd(ssl, int(sock));
        Transport t(int(sock), ssl);
        const auto until = accepted + limits.header_timeout;
        bool ready = false;
        for (;;) {
            int rc = SSL_accept(ssl);
            if (rc == 1) {
                ready = true;
                break;
            }
            int e = SSL_get_error(ssl, rc);
            if ((e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) || aborted_.load()) break;
            auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
            pollfd p{int(sock), short(e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT), 0};
            if (left <= 0 || ::poll(&p, 1, int(std::min<int64_t>(left, kSliceMs))) < 0) break;
        }
        ERR_clear_error();  // a failed handshake (a plain-HTTP client, a scanner) is that client's business
        if (ready) serve(t, open, from_client, accepted);
        t.close_notify();
    }
    --open_;
    count_client(client, -1);
    drop_unread(int(sock));
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return true;
}

void GatedServer::serve(Transport& t, size_t open, size_t from_client, Clock::time_point accepted) {
    const int fd = t.fd();
    Refusals refuse{t, on_refused};
    auto busy = [&] {
        refuse(503, "QUEUE_FULL",
               "too many open connections (limit " + std::to_string(limits.max_connections) + "); retry shortly",
               {{"retriable", true}, {"retry_after_ms", 1000}, {"limit_connections", limits.max_connections}}, true);
    };
    if (from_client > limits.max_connections_per_client) {
        return refuse(429, "TOO_MANY_CONNECTIONS",
                      "too many connections open from " + client_address(fd) + " (limit " +
                          std::to_string(limits.max_connections_per_client) +
                          " per client address); close one or retry shortly",
                      {{"retriable", true}, {"retry_after_ms", 1000},
                       {"limit_connections_per_client", limits.max_connections_per_client}},
                      true);
    }
    if (open > limits.max_connections + limits.probe_reserve) return busy();
    // In the reserve: one quick probe request, nothing else.
    const bool probe_only = open > limits.max_connections;
    const auto header_timeout = probe_only ? limits.probe_header_timeout : limits.header_timeout;
    std::string buf;  // read, not yet consumed (a pipelined request may already be here)
    for (size_t served = 0; served < limits.max_requests_per_connection; ++served) {
        refuse.next_request();
        // Wait for the next request. A fresh connection always gets its
        // first request served, even while draining (/health answers
        // "shutting_down"); a kept-alive one closes instead.
        if (served > 0 && draining_.load()) return;
        // A new connection's first head (after its TLS handshake) must be
        // complete within the header timeout of the accept, so one that
        // sends nothing or trickles holds its slot no longer than that; a
        // kept-alive connection waits up to the idle timeout for a first
        // byte, then its head gets the header timeout.
        const auto first_until = accepted + header_timeout;
        if (buf.empty() &&
            read_more(t, buf, served == 0 ? first_until : Clock::now() + limits.idle_timeout, aborted_) != Read::Ok)
            return;
        const auto head_until = served == 0 ? first_until : Clock::now() + header_timeout;
        RequestHead head;
        if (!read_head(t, buf, head_until, header_timeout, limits.framing, aborted_, refuse, head)) return;
        if (probe_only) {
            const std::string probe_path = head.target.substr(0, head.target.find('?'));
            if (head.method != "GET" || (probe_path != "/health" && probe_path != "/metrics")) return busy();
            head.wants_close = true;
        }
        if (!admit_content_type(head, refuse)) return;
        if (head.expect_continue && !send_all(t, "HTTP/1.1 100 Continue\r\n\r\n", limits.write_timeout)) return;
        std::string body;
        if (!read_body(t, buf, head, limits, aborted_, refuse, body)) return;

        const bool close = head.wants_close || draining_.load() || served + 1 == limits.max_requests_per_connection;
        CanonicalStream strm(t, canonical_request(head, body), limits.write_timeout);
        body.clear();
        bool closed = false;
        bool ok;
        {
            access::Scope scope;
            scope.entry.method = refuse.method;
            scope.entry.path = refuse.path;
            std::optional<crash_notice::Watch> watch;
            if (!t.tls()) watch.emplace(fd, head.target.rfind("/v1/", 0) == 0);
            t_client_fd = fd;
            ok = process_request(strm, close, closed, nullptr);
            t_client_fd = -1;
            scope.entry.bytes = strm.bytes_written();
            scope.entry.total_ms = std::chrono::duration<double, std::milli>(Clock::now() - refuse.head_done).count();
            scope.finish_queue_time();
            access::write(scope.entry);
        }
        if (!ok || closed || close) return;
    }
}

bool current_client_gone() { return t_client_fd >= 0 && !peer_alive(t_client_fd); }

void ConnectionThreads::enqueue(std::function<void()> fn) {
    {
        std::lock_guard lock(mu_);
        for (auto it = workers_.begin(); it != workers_.end();) {
            if (it->done->load()) {
                it->thread.join();
                it = workers_.erase(it);
            } else {
                ++it;
            }
        }
        auto done = std::make_shared<std::atomic<bool>>(false);
        try {
            workers_.push_back({std::thread([fn, done] {
                                    fn();
                                    done->store(true);
                                }),
                                done});
            return;
        } catch (const std::system_error&) {
        }
    }
    // No thread to be had: serve it here (the accept loop waits) rather than
    // leak the socket or let the exception end the listener.
    fn();
}

void ConnectionThreads::shutdown() {
    std::list<Worker> all;
    {
        std::lock_guard lock(mu_);
        all.swap(workers_);
    }
    for (auto& w : all) w.thread.join();
}

}  // namespace eh::http
