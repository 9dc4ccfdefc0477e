// Publishes KV events (kv_events.hpp) over ZeroMQ as a vLLM server does
// (vllm/distributed/kv_events.py's ZmqEventPublisher), so llm-d's KV-cache
// indexer and NVIDIA Dynamo subscribe to engine-host unchanged:
//   PUB socket: one multipart message per batch,
//     [topic, sequence number (8 bytes, big-endian), msgpack EventBatch];
//   ROUTER replay socket (optional): a request [empty, start (8 bytes,
//     big-endian)] is answered with every kept batch whose sequence number
//     is >= start as [empty, sequence, payload], then the end marker
//     [empty, 0xFF x 8 (-1), empty].
// Sequence numbers start at 0 and count batches; each batch gets its number
// when it is handed over, so a batch dropped before it was sent (the queue
// full) shows as a gap.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "eh/service/kv_events.hpp"

namespace eh::service {

struct KvPublisherOptions {
    // PUB endpoint: bound when it holds '*' or "::" or is ipc:// or
    // inproc:// (tcp://*:5557), else connected to (tcp://indexer:5557).
    std::string endpoint;
    std::string replay_endpoint;        // ROUTER, bound; empty: no replay
    std::string topic;                  // first frame of every message
    size_t replay_batches = 10000;      // batches kept for replay
    size_t replay_bytes = size_t(64) << 20;  // and at most this many payload bytes
    int send_hwm = 100000;              // PUB high-water mark (messages per subscriber)
    size_t max_queue = 100000;          // batches waiting to be sent; past it the oldest is dropped
    int data_parallel_rank = 0;
};

class ZmqKvPublisher : public KvEventSink {
public:
    // Binds or connects the sockets; throws eh::Error (InvalidRequest for an
    // endpoint ZeroMQ cannot parse, Internal when it cannot bind: in use,
    // not an address here) naming the endpoint.
    explicit ZmqKvPublisher(KvPublisherOptions options);
    ~ZmqKvPublisher() override;
    ZmqKvPublisher(const ZmqKvPublisher&) = delete;
    ZmqKvPublisher& operator=(const ZmqKvPublisher&) = delete;

    void publish(std::vector<KvEvent> batch) override;
    // Each event's `medium` ("GPU", "CPU"); "GPU" until set.
    void set_medium(std::string medium);
    // Sends what is queued, then closes the sockets (waiting at most 200 ms
    // for subscribers to take the last batches). Idempotent; the destructor
    // calls it.
    void stop();

    uint64_t batches() const { return next_seq_.load(); }   // sequence numbers handed out
    uint64_t dropped() const { return dropped_.load(); }    // of them never sent (queue full)
    const std::string& topic() const { return options_.topic; }

private:
    struct Pending {
        uint64_t seq;
        double ts;
        std::vector<KvEvent> events;
    };
    void run();
    void send(Pending& p);
    void serve_replay();

    KvPublisherOptions options_;
    void* ctx_ = nullptr;
    void* pub_ = nullptr;
    void* replay_ = nullptr;

    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Pending> queue_;
    std::string medium_ = "GPU";
    bool stopping_ = false;
    std::atomic<uint64_t> next_seq_{0}, dropped_{0};

    // The sending thread's own: kept batches for replay.
    std::deque<std::pair<uint64_t, std::string>> kept_;
    size_t kept_bytes_ = 0;
    std::thread thread_;
    std::once_flag stop_once_;
};

}  // namespace eh::service
