// A deliberately small HTTP/1.1 client over a raw socket, so tests control
// every byte sent (hostile requests) and can drop a connection mid-stream.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace eh::test {

struct HttpResponse {
    int status = 0;
    std::map<std::string, std::string> headers;  // lower-case names
    std::string body;                            // de-chunked
    std::string header(const std::string& k) const {
        auto it = headers.find(k);
        return it == headers.end() ? "" : it->second;
    }
};

struct SseEvent {
    std::string event;  // "" for data-only frames
    std::string data;
};

inline int connect_local(int port) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}

inline bool send_all(int fd, const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
        ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
        if (n <= 0) return false;
        off += size_t(n);
    }
    return true;
}

inline std::string build_request(const std::string& method, const std::string& path, const std::string& body,
                                 const std::map<std::string, std::string>& headers = {}) {
    std::string r = method + " " + path + " HTTP/1.1\r\n" + (headers.count("Host") ? "" : "Host: 127.0.0.1\r\n") +
                    "Connection: close\r\n";
    bool has_ct = false;
    for (auto& [k, v] : headers) {
        r += k + ": " + v + "\r\n";
        has_ct = has_ct || k == "Content-Type";
    }
    if (method == "POST" || !body.empty()) {
        if (!has_ct) r += "Content-Type: application/json\r\n";
        r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    }
    return r + "\r\n" + body;
}

// Incremental response reader: headers, then body bytes as they arrive.
class ResponseReader {
public:
    explicit ResponseReader(int fd) : fd_(fd) {}
    // Reads more bytes (up to timeout). False on EOF/timeout.
    bool fill(int timeout_ms = 10000) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, timeout_ms) <= 0) return false;
        char buf[16384];
        ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
        if (n <= 0) return false;
        raw_.append(buf, size_t(n));
        return true;
    }
    bool read_headers(HttpResponse& r) {
        size_t end;
        while ((end = raw_.find("\r\n\r\n")) == std::string::npos)
            if (!fill()) return false;
        std::string head = raw_.substr(0, end);
        raw_.erase(0, end + 4);
        size_t sp = head.find(' ');
        r.status = std::stoi(head.substr(sp + 1, 3));
        size_t pos = head.find("\r\n");
        while (pos != std::string::npos && pos < head.size()) {
            size_t next = head.find("\r\n", pos + 2);
            std::string line = head.substr(pos + 2, next == std::string::npos ? std::string::npos : next - pos - 2);
            size_t c = line.find(':');
            if (c != std::string::npos) {
                std::string k = line.substr(0, c);
                for (auto& ch : k) ch = char(std::tolower(ch));
                std::string v = line.substr(c + 1);
                while (!v.empty() && v.front() == ' ') v.erase(0, 1);
                r.headers[k] = v;
            }
            pos = next;
        }
        chunked_ = r.header("transfer-encoding").find("chunked") != std::string::npos;
        done_ = false;  // a kept-alive connection reads several responses
        remaining_ = -1;
        if (!chunked_ && !r.header("content-length").empty()) remaining_ = std::stoll(r.header("content-length"));
        return true;
    }
    // Next piece of body; false at the end.
    bool next_body(std::string& out, int timeout_ms = 10000) {
        out.clear();
        if (done_) return false;
        if (!chunked_) {
            if (remaining_ == 0) return done_ = true, false;
            while (raw_.empty())
                if (!fill(timeout_ms)) return done_ = true, false;
            size_t take = remaining_ < 0 ? raw_.size() : std::min<size_t>(raw_.size(), size_t(remaining_));
            out = raw_.substr(0, take);
            raw_.erase(0, take);
            if (remaining_ > 0) remaining_ -= int64_t(take);
            return true;
        }
        for (;;) {
            size_t le = raw_.find("\r\n");
            if (le != std::string::npos) {
                size_t n = std::stoul(raw_.substr(0, le), nullptr, 16);
                if (n == 0) return done_ = true, false;
                if (raw_.size() >= le + 2 + n + 2) {
                    out = raw_.substr(le + 2, n);
                    raw_.erase(0, le + 2 + n + 2);
                    return true;
                }
            }
            if (!fill(timeout_ms)) return done_ = true, false;
        }
    }

private:
    int fd_;
    std::string raw_;
    bool chunked_ = false;
    bool done_ = false;
    int64_t remaining_ = -1;
};

// Sends `raw_request` on the connected socket `fd`, reads the whole
// response and closes the socket.
inline HttpResponse send_and_read(int fd, const std::string& raw_request) {
    HttpResponse r;
    send_all(fd, raw_request);
    ResponseReader rd(fd);
    if (rd.read_headers(r)) {
        std::string piece;
        while (rd.next_body(piece)) r.body += piece;
    }
    ::close(fd);
    return r;
}

inline HttpResponse http_raw(int port, const std::string& raw_request) {
    int fd = connect_local(port);
    if (fd < 0) throw std::runtime_error("cannot connect");
    return send_and_read(fd, raw_request);
}

inline HttpResponse http(int port, const std::string& method, const std::string& path, const std::string& body = "",
                         const std::map<std::string, std::string>& headers = {}) {
    return http_raw(port, build_request(method, path, body, headers));
}

inline std::vector<SseEvent> parse_sse(const std::string& text) {
    std::vector<SseEvent> out;
    size_t pos = 0;
    while (pos < text.size()) {
        size_t end = text.find("\n\n", pos);
        if (end == std::string::npos) break;
        std::string block = text.substr(pos, end - pos);
        pos = end + 2;
        SseEvent ev;
        bool any = false;
        size_t lp = 0;
        while (lp <= block.size()) {
            size_t le = block.find('\n', lp);
            std::string line = block.substr(lp, le == std::string::npos ? std::string::npos : le - lp);
            if (line.rfind("event: ", 0) == 0) ev.event = line.substr(7), any = true;
            else if (line.rfind("data: ", 0) == 0) ev.data += line.substr(6), any = true;
            if (le == std::string::npos) break;
            lp = le + 1;
        }
        if (any) out.push_back(ev);
    }
    return out;
}

// Streams an SSE response; `on_event` returns false to drop the connection.
inline HttpResponse sse_stream(int port, const std::string& path, const std::string& body,
                               const std::function<bool(const SseEvent&)>& on_event,
                               const std::map<std::string, std::string>& headers = {}) {
    HttpResponse r;
    int fd = connect_local(port);
    if (fd < 0) throw std::runtime_error("cannot connect");
    send_all(fd, build_request("POST", path, body, headers));
    ResponseReader rd(fd);
    if (!rd.read_headers(r)) {
        ::close(fd);
        return r;
    }
    std::string buf, piece;
    while (rd.next_body(piece)) {
        r.body += piece;
        buf += piece;
        size_t end;
        bool stop = false;
        while (!stop && (end = buf.find("\n\n")) != std::string::npos) {
            auto evs = parse_sse(buf.substr(0, end + 2));
            buf.erase(0, end + 2);
            for (auto& e : evs)
                if (!on_event(e)) stop = true;
        }
        if (stop) break;
    }
    ::close(fd);
    return r;
}

}  // namespace eh::test
