// The connection layer under cpp-httplib: one thread per connection (a
// capped number of them), each reading its requests with deadlines and
// limits (framing.hpp) and handing httplib one canonical request at a time.
//
// Why not httplib's own reading: Debian's 0.11.4 applies no limit to chunked
// or compressed bodies, waits out its read timeout on malformed framing,
// lets a header-trickling client hold a pool thread for ever, closes a
// connection after 5 requests (dropping pipelined ones) and serves Range on
// every route. Its routing, handlers and response writing are kept as they
// are: process_request() runs on the canonical bytes.
//
// HTTPS (--ssl-cert-file): the same loop reads through OpenSSL (the library
// cpp-httplib's SSLServer uses); httplib's SSLServer itself would read the
// requests its own way, without the limits above.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "framing.hpp"

namespace eh::http {

// The largest --ssl-cert-file / --ssl-key-file read (a chain is a few KiB).
inline constexpr size_t kMaxTlsFileBytes = size_t(1) << 20;

// Every number here is documented in docs/http-api.md ("Connection limits").
struct ConnectionLimits {
    FramingLimits framing;
    std::chrono::milliseconds header_timeout{5000};  // first byte of a request -> end of its head
    std::chrono::milliseconds body_timeout{30000};   // end of the head -> end of the body
    std::chrono::milliseconds idle_timeout{5000};    // keep-alive: wait for the next request
    std::chrono::milliseconds write_timeout{30000};  // one response write making no progress
    size_t max_connections = 256;                    // open at once for any route
    // Past max_connections, this many more are read with a short header
    // timeout and may only ask GET /health or GET /metrics (so probes still
    // answer while the cap is reached); anything else, or past the reserve,
    // gets 503 QUEUE_FULL and is closed.
    size_t probe_reserve = 64;
    std::chrono::milliseconds probe_header_timeout{1000};
    // Open at once from one client address (an IPv6 client: its /64),
    // loopback included, counted against the caps above too; past it a new
    // connection gets 429 TOO_MANY_CONNECTIONS and is closed before
    // anything of it is read, so no one address can fill the general slots,
    // let alone the probe reserve.
    size_t max_connections_per_client = 64;
    size_t max_requests_per_connection = 10000;
};

class GatedServer : public httplib::Server {
public:
    GatedServer();
    ConnectionLimits limits;
    // Called for every request refused here (status), for the metrics.
    std::function<void(int)> on_refused;
    ~GatedServer() override;

    // Serves HTTPS with this PEM certificate (chain) and key, each a
    // regular file of at most kMaxTlsFileBytes; throws eh::Error naming the
    // file and the reason (OpenSSL's for a bad PEM) when they cannot be
    // used. Call before listening.
    void use_tls(const std::string& cert_file, const std::string& key_file);
    bool tls() const { return tls_ != nullptr; }

    // Shutdown, first phase: connections close after their current response
    // instead of waiting for another request.
    void begin_drain() { draining_.store(true); }
    // Second phase (before httplib's stop()): reads in progress are abandoned
    // at once, so no idle or half-sent request holds the shutdown.
    void abort_reads() {
        draining_.store(true);
        aborted_.store(true);
    }
    int open_connections() const { return open_.load(); }
    // httplib listens with a backlog of 5, so a burst of connects waits out
    // SYN retries (1 s and more); call after binding to widen it.
    void widen_backlog(int backlog);

private:
    bool process_and_close_socket(socket_t sock) override;
    // open: connections open, this one included; from_client: those open
    // from its client address, this one included.
    void serve(class Transport& t, size_t open, size_t from_client, std::chrono::steady_clock::time_point accepted);
    // Counts a connection from `client` in (+1) or out (-1); the count after.
    size_t count_client(const std::string& client, int delta);

    SSL_CTX* tls_ = nullptr;
    std::atomic<bool> draining_{false}, aborted_{false};
    std::atomic<int> open_{0};
    std::mutex clients_mu_;
    std::unordered_map<std::string, size_t> clients_;  // client address -> connections open
};

// Whether the client whose request the calling thread is handling has closed
// its connection (false off a connection thread). For work a handler does
// before it answers (a chat template's evaluation).
bool current_client_gone();

// httplib's task queue, one thread per connection: a slow client holds its
// own thread, never one that /health needs. shutdown() joins them all.
class ConnectionThreads : public httplib::TaskQueue {
public:
    void enqueue(std::function<void()> fn) override;
    void shutdown() override;

private:
    struct Worker {
        std::thread thread;
        std::shared_ptr<std::atomic<bool>> done;
    };
    std::mutex mu_;
    std::list<Worker> workers_;
};

}  // namespace eh::http
