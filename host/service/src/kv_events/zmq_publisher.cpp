#include <zmq.h>

#include <fmt/format.h>

#include <chrono>
#include <cstring>

#include "eh/error.hpp"
#include "eh/service/event_log.hpp"
#include "eh/service/kv_event_publisher.hpp"
#include "encode.hpp"

namespace eh::service {
namespace {

std::string be64(uint64_t v) {
    std::string s(8, '\0');
    for (int i = 7; i >= 0; --i, v >>= 8) s[size_t(i)] = char(v & 0xFF);
    return s;
}

// vLLM's rule: bind a wildcard or local-transport endpoint, connect to a named one.
bool binds(const std::string& endpoint) {
    return endpoint.find('*') != std::string::npos || endpoint.find("::") != std::string::npos ||
           endpoint.rfind("ipc://", 0) == 0 || endpoint.rfind("inproc://", 0) == 0;
}

[[noreturn]] void fail(const char* flag, const std::string& endpoint, const char* verb) {
    const int err = zmq_errno();
    const bool syntax = err == EINVAL || err == EPROTONOSUPPORT || err == ENOCOMPATPROTO;
    throw Error(syntax ? Code::InvalidRequest : Code::Internal,
                fmt::format("{} {}: cannot {} it ({})", flag, endpoint, verb, zmq_strerror(err)));
}

double now_seconds() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Sends `frames` as one multipart message; false when the socket refused it.
bool send_frames(void* sock, std::initializer_list<std::string_view> frames, int flags = 0) {
    size_t i = 0;
    for (std::string_view f : frames) {
        const bool more = ++i < frames.size();
        if (zmq_send(sock, f.data(), f.size(), flags | (more ? ZMQ_SNDMORE : 0)) < 0) return false;
    }
    return true;
}

}  // namespace

ZmqKvPublisher::ZmqKvPublisher(KvPublisherOptions options) : options_(std::move(options)) {
    ctx_ = zmq_ctx_new();
    if (!ctx_) throw Error(Code::Internal, "cannot start ZeroMQ");
    try {
        pub_ = zmq_socket(ctx_, ZMQ_PUB);
        const int linger = 200;  // at stop, the last batches get 200 ms to reach subscribers
        zmq_setsockopt(pub_, ZMQ_LINGER, &linger, sizeof linger);
        zmq_setsockopt(pub_, ZMQ_SNDHWM, &options_.send_hwm, sizeof options_.send_hwm);
        if (binds(options_.endpoint)) {
            if (zmq_bind(pub_, options_.endpoint.c_str()) != 0) fail("--kv-events-endpoint", options_.endpoint, "bind");
        } else if (zmq_connect(pub_, options_.endpoint.c_str()) != 0) {
            fail("--kv-events-endpoint", options_.endpoint, "connect to");
        }
        if (!options_.replay_endpoint.empty()) {
            replay_ = zmq_socket(ctx_, ZMQ_ROUTER);
            const int zero = 0;
            zmq_setsockopt(replay_, ZMQ_LINGER, &zero, sizeof zero);
            // A replay request is three short frames: anything longer is refused by ZeroMQ.
            const int64_t max_msg = 1024;
            zmq_setsockopt(replay_, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg);
            if (zmq_bind(replay_, options_.replay_endpoint.c_str()) != 0)
                fail("--kv-events-replay-endpoint", options_.replay_endpoint, "bind");
        }
    } catch (...) {
        if (pub_) zmq_close(pub_);
        if (replay_) zmq_close(replay_);
        zmq_ctx_term(ctx_);
        throw;
    }
    thread_ = std::thread([this] { run(); });
}

ZmqKvPublisher::~ZmqKvPublisher() { stop(); }

void ZmqKvPublisher::publish(std::vector<KvEvent> batch) {
    if (batch.empty()) return;
    {
        std::lock_guard lock(mu_);
        if (stopping_) return;
        if (queue_.size() >= options_.max_queue) {
            queue_.pop_front();
            dropped_.fetch_add(1);
        }
        queue_.push_back({next_seq_.fetch_add(1), now_seconds(), std::move(batch)});
    }
    cv_.notify_one();
}

void ZmqKvPublisher::set_medium(std::string medium) {
    std::lock_guard lock(mu_);
    medium_ = std::move(medium);
}

void ZmqKvPublisher::stop() {
    std::call_once(stop_once_, [this] {
        {
            std::lock_guard lock(mu_);
            stopping_ = true;
        }
        cv_.notify_one();
        if (thread_.joinable()) thread_.join();
        if (replay_) zmq_close(replay_);
        zmq_close(pub_);
        zmq_ctx_term(ctx_);  // waits out the PUB socket's linger
    });
}

void ZmqKvPublisher::send(Pending& p) {
    std::string medium;
    {
        std::lock_guard lock(mu_);
        medium = medium_;
    }
    std::string payload = kv_wire::encode_batch(p.ts, p.events, medium, options_.data_parallel_rank);
    // A PUB socket never blocks: past the high-water mark a slow subscriber
    // misses messages (and sees the gap in sequence numbers).
    send_frames(pub_, {options_.topic, be64(p.seq), payload});
    if (!replay_) return;
    kept_bytes_ += payload.size();
    kept_.emplace_back(p.seq, std::move(payload));
    while (!kept_.empty() && (kept_.size() > options_.replay_batches || kept_bytes_ > options_.replay_bytes)) {
        kept_bytes_ -= kept_.front().second.size();
        kept_.pop_front();
    }
}

void ZmqKvPublisher::serve_replay() {
    // [identity, empty, start]; frames past the third are read and dropped.
    std::vector<std::string> frames;
    int more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, replay_, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return;
        }
        if (frames.size() < 3) frames.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
        more = zmq_msg_more(&m);
        zmq_msg_close(&m);
    }
    if (frames.size() < 2 || !frames[1].empty()) return;  // not a REQ/DEALER-framed request: nowhere to answer
    const std::string& id = frames[0];
    static const std::string kEnd(8, '\xFF');
    if (frames.size() != 3 || frames[2].size() != 8) {
        log_event(spdlog::level::warn, "kv_events_replay_refused",
                  {{"message", "a replay request is one 8-byte big-endian sequence number"}});
        send_frames(replay_, {id, "", kEnd, ""}, ZMQ_DONTWAIT);
        return;
    }
    uint64_t start = 0;
    for (unsigned char c : frames[2]) start = (start << 8) | c;
    for (const auto& [seq, payload] : kept_)
        if (seq >= start && !send_frames(replay_, {id, "", be64(seq), payload}, ZMQ_DONTWAIT)) return;  // client gone or full
    send_frames(replay_, {id, "", kEnd, ""}, ZMQ_DONTWAIT);
}

void ZmqKvPublisher::run() {
    for (;;) {
        std::deque<Pending> ready;
        bool stopping;
        {
            std::unique_lock lock(mu_);
            // With a replay socket, wake every 10 ms to answer it.
            cv_.wait_for(lock, std::chrono::milliseconds(replay_ ? 10 : 1000),
                         [&] { return stopping_ || !queue_.empty(); });
            ready.swap(queue_);
            stopping = stopping_;
        }
        for (Pending& p : ready) send(p);
        if (replay_) {
            zmq_pollitem_t item{replay_, 0, ZMQ_POLLIN, 0};
            while (zmq_poll(&item, 1, 0) > 0 && (item.revents & ZMQ_POLLIN)) serve_replay();
        }
        if (stopping) {
            std::lock_guard lock(mu_);
            if (queue_.empty()) return;
        }
    }
}

}  // namespace eh::service
