#include "connection.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>
#include <cstring>

#include "crash_notice.hpp"
#include "impl.hpp"

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
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
    }
}

bool send_all(int fd, std::string_view s, std::chrono::milliseconds timeout) {
    const auto until = Clock::now() + timeout;
    while (!s.empty()) {
        pollfd p{fd, POLLOUT, 0};
        int left = int(std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count());
        if (left <= 0 || ::poll(&p, 1, left) <= 0) return false;
        ssize_t n = ::send(fd, s.data(), s.size(), MSG_NOSIGNAL);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) return false;
        s.remove_prefix(size_t(n));
    }
    return true;
}

// A complete error response; the connection is closed after it, since the
// rest of the request (if any) was not read.
std::string error_response(int status, const std::string& code, const std::string& message, const nlohmann::json& details,
                           bool retry_after) {
    std::string cid = new_correlation_id();
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
    CanonicalStream(int fd, std::string request, std::chrono::milliseconds write_timeout)
        : fd_(fd), in_(std::move(request)), write_timeout_(write_timeout) {}

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
        for (;;) {
            pollfd p{fd_, POLLOUT, 0};
            if (::poll(&p, 1, int(write_timeout_.count())) <= 0) return -1;
            ssize_t n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
            if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
            if (n > 0) crash_notice::wrote(fd_, std::string_view(ptr, size_t(n)), size_t(n) == size);
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

    int fd_;
    std::string in_;
    size_t pos_ = 0;
    std::chrono::milliseconds write_timeout_;
};

enum class Read { Ok, Closed, TimedOut, Aborted };

// Appends what the socket has, waiting until `until` in short slices so the
// stop flags are seen.
Read read_more(int fd, std::string& buf, Clock::time_point until, const std::atomic<bool>& aborted) {
    for (;;) {
        if (aborted.load()) return Read::Aborted;
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
        if (left <= 0) return Read::TimedOut;
        pollfd p{fd, POLLIN, 0};
        int rc = ::poll(&p, 1, int(std::min<int64_t>(left, kSliceMs)));
        if (rc < 0 && errno != EINTR) return Read::Closed;
        if (rc <= 0) continue;
        char chunk[16384];
        ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) return Read::Closed;
        buf.append(chunk, size_t(n));
        return Read::Ok;
    }
}

// After an error answer the rest of the request is unread; closing now would
// make the kernel send a reset, which can destroy the answer before the
// client reads it. So: end our side, then read and drop what still comes for
// a short while (bounded in bytes and time).
void linger_close(int fd) {
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

}  // namespace

GatedServer::GatedServer() {
    new_task_queue = [] { return new ConnectionThreads(); };
    set_keep_alive_max_count(limits.max_requests_per_connection);
}

void GatedServer::widen_backlog(int backlog) {
    socket_t s = svr_sock_.load();
    if (s != INVALID_SOCKET) ::listen(s, backlog);  // Linux updates the backlog of a listening socket
}

bool GatedServer::process_and_close_socket(socket_t sock) {
    // httplib writes a head and its body (and every SSE event) as separate
    // sends; with Nagle on, a kept-alive connection waits out the peer's
    // delayed ACK (~40 ms) before each body.
    int one = 1;
    ::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    serve(int(sock), size_t(++open_));
    --open_;
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return true;
}

void GatedServer::serve(int fd, size_t open) {
    auto refuse = [&](int status, const std::string& code, const std::string& message, const nlohmann::json& details,
                      bool retry_after = false) {
        if (on_refused) on_refused(status);
        if (!send_all(fd, error_response(status, code, message, details, retry_after), std::chrono::milliseconds(1000)))
            return;
        // Not when over the connection cap: a flood must not keep threads.
        if (!retry_after) linger_close(fd);
    };
    auto busy = [&] {
        refuse(503, "QUEUE_FULL",
               "too many open connections (limit " + std::to_string(limits.max_connections) + "); retry shortly",
               {{"retriable", true}, {"retry_after_ms", 1000}, {"limit_connections", limits.max_connections}}, true);
    };
    if (open > limits.max_connections + limits.probe_reserve) return busy();
    // In the reserve: one quick probe request, nothing else.
    const bool probe_only = open > limits.max_connections;
    const auto header_timeout = probe_only ? limits.probe_header_timeout : limits.header_timeout;
    const FramingLimits& fl = limits.framing;
    std::string buf;  // read, not yet consumed (a pipelined request may already be here)
    for (size_t served = 0; served < limits.max_requests_per_connection; ++served) {
        // Wait for the next request. A fresh connection always gets its
        // first request served, even while draining (/health answers
        // "shutting_down"); a kept-alive one closes instead.
        if (served > 0 && draining_.load()) return;
        if (buf.empty() && read_more(fd, buf, Clock::now() + limits.idle_timeout, aborted_) != Read::Ok) return;

        // The head, within the header timeout.
        const auto head_until = Clock::now() + header_timeout;
        size_t head_end;
        while ((head_end = buf.find("\r\n\r\n")) == std::string::npos) {
            if (buf.size() > fl.max_head_bytes) {
                refuse(431, "INVALID_REQUEST",
                       "the request head is larger than the limit of " + std::to_string(fl.max_head_bytes) + " bytes",
                       {{"limit_bytes", fl.max_head_bytes}});
                return;
            }
            Read r = read_more(fd, buf, head_until, aborted_);
            if (r == Read::TimedOut)
                refuse(408, "INVALID_REQUEST",
                       "the request head did not arrive within " + std::to_string(header_timeout.count()) + " ms",
                       {{"timeout_ms", header_timeout.count()}});
            if (r != Read::Ok) return;
        }
        RequestHead head;
        FramingError err;
        if (!parse_head(std::string_view(buf).substr(0, head_end), fl, head, err)) {
            nlohmann::json details = nlohmann::json::object();
            if (err.status == 413) details["limit_bytes"] = fl.max_body_bytes;
            refuse(err.status, "INVALID_REQUEST", err.message, details);
            return;
        }
        buf.erase(0, head_end + 4);
        if (probe_only) {
            const std::string path = head.target.substr(0, head.target.find('?'));
            if (head.method != "GET" || (path != "/health" && path != "/metrics")) return busy();
            head.wants_close = true;
        }
        if (head.expect_continue && !send_all(fd, "HTTP/1.1 100 Continue\r\n\r\n", limits.write_timeout)) return;

        // The body, within the body timeout, de-chunked under the limit.
        const auto body_until = Clock::now() + limits.body_timeout;
        auto body_timed_out = [&] {
            refuse(408, "INVALID_REQUEST",
                   "the request body did not arrive within " + std::to_string(limits.body_timeout.count()) + " ms",
                   {{"timeout_ms", limits.body_timeout.count()}});
        };
        std::string raw;
        if (head.chunked) {
            ChunkedDecoder dec(fl);
            for (;;) {
                size_t used = 0;
                auto st = dec.feed(buf, used, raw, err);
                buf.erase(0, used);
                if (st == ChunkedDecoder::Status::Done) break;
                if (st == ChunkedDecoder::Status::Failed) {
                    nlohmann::json details = nlohmann::json::object();
                    if (err.status == 413) details["limit_bytes"] = fl.max_body_bytes;
                    refuse(err.status, "INVALID_REQUEST", err.message, details);
                    return;
                }
                Read r = read_more(fd, buf, body_until, aborted_);
                if (r == Read::TimedOut) body_timed_out();
                if (r != Read::Ok) return;
            }
        } else {
            while (buf.size() < head.content_length) {
                Read r = read_more(fd, buf, body_until, aborted_);
                if (r == Read::TimedOut) body_timed_out();
                if (r != Read::Ok) return;
            }
            raw = buf.substr(0, size_t(head.content_length));
            buf.erase(0, size_t(head.content_length));
        }
        std::string body;
        if (!inflate_body(raw, head.coding, fl.max_body_bytes, body, err)) {
            nlohmann::json details = nlohmann::json::object();
            if (err.status == 413) details["limit_bytes"] = fl.max_body_bytes;
            refuse(err.status, "INVALID_REQUEST", err.message, details);
            return;
        }
        raw.clear();

        const bool close = head.wants_close || draining_.load() || served + 1 == limits.max_requests_per_connection;
        CanonicalStream strm(fd, canonical_request(head, body), limits.write_timeout);
        body.clear();
        bool closed = false;
        crash_notice::Watch watch(fd, head.target.rfind("/v1/", 0) == 0);
        t_client_fd = fd;
        bool ok = process_request(strm, close, closed, nullptr);
        t_client_fd = -1;
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
