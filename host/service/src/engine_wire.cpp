#include "engine_wire.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <type_traits>
#include <utility>

namespace eh::service::wire {
namespace {

// Writer and Reader have the same `field`, `array` and `count` calls, so
// one function per message lists its fields for both directions.
class Writer {
public:
    static constexpr bool reading = false;
    explicit Writer(Msg type) {
        buf_.resize(4);
        field(uint8_t(type));
    }
    template <class T>
    void field(const T& v) {
        static_assert(std::is_trivially_copyable_v<T>);
        bytes(&v, sizeof(T));
    }
    void field(const bool& v) { field(uint8_t(v)); }
    void field(const Code& v) { field(uint32_t(v)); }
    void field(const std::string& s) { array(std::span<const char>(s.data(), std::min<size_t>(s.size(), kMaxString))); }
    template <size_t N>
    void field(const char (&s)[N]) {
        field(std::string(s, strnlen(s, N)));
    }
    template <class T>
    void array(std::span<const T> v) {
        field(uint32_t(v.size()));
        bytes(v.data(), v.size_bytes());
    }
    void count(const uint32_t& n, uint32_t, size_t, const char*) { field(n); }
    std::vector<uint8_t> frame() && {
        const size_t body = buf_.size() - 4;
        if (body > kMaxFrame) throw ProtocolError(fmt::format("a {}-byte message is over the {}-byte limit", body, kMaxFrame));
        const uint32_t n = uint32_t(body);
        std::memcpy(buf_.data(), &n, 4);
        return std::move(buf_);
    }

private:
    void bytes(const void* p, size_t n) {
        const size_t at = buf_.size();
        buf_.resize(at + n);
        if (n) std::memcpy(buf_.data() + at, p, n);
    }
    std::vector<uint8_t> buf_;
};

class Reader {
public:
    static constexpr bool reading = true;
    explicit Reader(std::span<const uint8_t> b) : b_(b) {
        if (b_.empty()) throw ProtocolError("an empty message");
        if (b_.size() > kMaxFrame) throw ProtocolError("a message over the frame limit");
    }
    template <class T>
    void field(T& v) {
        static_assert(std::is_trivially_copyable_v<T>);
        need(sizeof(T));
        std::memcpy(&v, b_.data() + at_, sizeof(T));
        at_ += sizeof(T);
    }
    void field(bool& v) {
        uint8_t b;
        field(b);
        if (b > 1) throw ProtocolError(fmt::format("a flag of {}", b));
        v = b == 1;
    }
    void field(Code& v) {
        uint32_t c;
        field(c);
        if (c > uint32_t(Code::EngineCrashed)) throw ProtocolError(fmt::format("an error code of {}", c));
        v = Code(c);
    }
    void field(std::string& s) {
        std::vector<char> c;
        array(c, kMaxString, "string bytes");
        s.assign(c.begin(), c.end());
    }
    template <size_t N>
    void field(char (&s)[N]) {
        std::string v;
        field(v);
        if (v.size() >= N) throw ProtocolError(fmt::format("a {}-byte name where at most {} fit", v.size(), N - 1));
        std::memset(s, 0, N);
        std::memcpy(s, v.data(), v.size());
    }
    template <class T>
    void array(std::vector<T>& v, uint32_t max, const char* what) {
        uint32_t n;
        count(n, max, sizeof(T), what);
        v.resize(n);
        if (n) std::memcpy(v.data(), b_.data() + at_, size_t(n) * sizeof(T));
        at_ += size_t(n) * sizeof(T);
    }
    // A count of things each at least `each` bytes long: one the rest of
    // the message cannot hold is refused before anything is allocated.
    void count(uint32_t& n, uint32_t max, size_t each, const char* what) {
        field(n);
        if (n > max) throw ProtocolError(fmt::format("{} {} over the limit of {}", n, what, max));
        need(size_t(n) * each);
    }
    void end() const {
        if (at_ != b_.size()) throw ProtocolError(fmt::format("{} bytes left after the message", b_.size() - at_));
    }

private:
    void need(size_t n) const {
        if (n > b_.size() - at_) throw ProtocolError(fmt::format("the message ends {} bytes early", n - (b_.size() - at_)));
    }
    std::span<const uint8_t> b_;
    size_t at_ = 0;
};

template <class IO, class B>
void budget_fields(IO& io, B& b) {
    io.field(b.max_seqs);
    io.field(b.max_step_tokens);
    io.field(b.max_seq_tokens);
    io.field(b.budget_bytes);
    io.field(b.memory_fraction);
    io.field(b.kv_type);
}

template <class IO, class P>
void sampling_fields(IO& io, P& p) {
    io.field(p.temperature);
    io.field(p.top_k);
    io.field(p.top_p);
    io.field(p.min_p);
    io.field(p.repetition_penalty);
    io.field(p.repetition_window);
    io.field(p.seed);
    io.field(p.presence_penalty);
    io.field(p.frequency_penalty);
}

template <class IO, class F>
void facts_fields(IO& io, F& f) {
    auto& i = f.info;
    io.field(i.architecture);
    io.field(i.quant_kind);
    io.field(i.context_length);
    io.field(i.vocab_size);
    io.field(i.device_bytes_used);
    io.field(i.host_bytes_used);
    io.field(i.device_name);
    io.field(i.compute_capability);
    io.field(i.runtime_version);
    io.field(i.kv_bytes_per_token);
    io.field(f.plugin_name);
    io.field(f.plugin_version);
    io.field(f.logits);
}

template <class IO, class L>
void limits_fields(IO& io, L& l) {
    io.field(l.max_seqs);
    io.field(l.max_step_tokens);
    io.field(l.max_step_entries);
    io.field(l.max_seq_tokens);
    io.field(l.block_tokens);
    io.field(l.total_blocks);
    io.field(l.block_bytes);
    io.field(l.kv_type);
    io.field(l.max_draft_tokens);
    io.field(l.can_fork);
    io.field(l.batched);
}

// Every request but Step, whose entries are spans on the way out.
template <class IO, class Q>
void request_fields(IO& io, Q& q) {
    switch (q.type) {
    case Msg::KvInit: budget_fields(io, q.budget); break;
    case Msg::Create:
    case Msg::Residency:
    case Msg::Ping: break;
    case Msg::Fork:
    case Msg::Truncate:
    case Msg::SetAdapter:
        io.field(q.seq);
        io.field(q.n);
        break;
    case Msg::Release: io.field(q.seq); break;
    case Msg::Park:
        io.field(q.seq);
        io.field(q.n);
        io.field(q.max_bytes);
        break;
    case Msg::Unpark:
        io.field(q.parked);
        if constexpr (IO::reading) io.array(q.tokens, kMaxFrame / 4, "tokens");
        else io.array(std::span<const int32_t>(q.tokens));
        break;
    case Msg::DropParked: io.field(q.parked); break;
    case Msg::SetSampling:
        io.field(q.seq);
        sampling_fields(io, q.sampling);
        break;
    default: throw ProtocolError(fmt::format("unknown request type {}", uint8_t(q.type)));
    }
}

template <class IO, class R>
void reply_fields(IO& io, R& q) {
    switch (q.type) {
    case Msg::Progress:
        io.field(q.progress);
        io.field(q.message);
        break;
    case Msg::Ready: {
        uint32_t magic = kMagic;
        uint16_t version = kVersion;
        io.field(magic);
        io.field(version);
        if (magic != kMagic) throw ProtocolError("the engine process's greeting has the wrong magic number");
        if (version != kVersion)
            throw ProtocolError(fmt::format("the engine process speaks protocol version {}; this host speaks {}", version,
                                            kVersion));
        facts_fields(io, q.facts);
        if (q.facts.info.vocab_size > kMaxVocab) throw ProtocolError(fmt::format("a vocabulary of {} tokens", q.facts.info.vocab_size));
        break;
    }
    case Msg::LoadFailed:
    case Msg::Error:
        io.field(q.code);
        io.field(q.message);
        break;
    case Msg::KvInit:
        limits_fields(io, q.limits);
        io.field(q.has_logits);
        io.field(q.can_park);
        io.field(q.device_bytes);
        io.field(q.free_blocks);
        if (q.limits.max_step_entries > kMaxEntries)
            throw ProtocolError(fmt::format("{} step entries granted", q.limits.max_step_entries));
        break;
    case Msg::Create:
    case Msg::Fork:
    case Msg::Unpark:
        io.field(q.seq);
        io.field(q.free_blocks);
        break;
    case Msg::Park:
        io.field(q.parked);
        io.field(q.parked_bytes);
        io.field(q.free_blocks);
        break;
    case Msg::DropParked:
    case Msg::Truncate:
    case Msg::Release:
    case Msg::SetSampling:
    case Msg::SetAdapter: io.field(q.free_blocks); break;
    case Msg::Step: {
        io.field(q.kv_full);
        io.field(q.free_blocks);
        uint32_t n = uint32_t(q.tokens.size());
        io.count(n, kMaxEntries, 12, "step results");
        if constexpr (IO::reading) {
            q.tokens.resize(n);
            q.accepted.resize(n);
            q.logits.resize(n);
        }
        for (uint32_t i = 0; i < n; ++i) {
            io.field(q.tokens[i]);
            if constexpr (IO::reading) io.field(q.accepted[i]);
            else io.field(i < q.accepted.size() ? q.accepted[i] : 0u);
            if constexpr (IO::reading) io.array(q.logits[i], kMaxVocab, "logits");
            else io.array(i < q.logits.size() ? std::span<const float>(q.logits[i]) : std::span<const float>());
        }
        break;
    }
    case Msg::Ping: break;
    case Msg::Residency:
        io.field(q.resident);
        io.field(q.message);
        break;
    default: throw ProtocolError(fmt::format("unknown reply type {}", uint8_t(q.type)));
    }
}

}  // namespace

uint32_t frame_length(const uint8_t header[4]) {
    uint32_t n;
    std::memcpy(&n, header, 4);
    if (n == 0 || n > kMaxFrame) throw ProtocolError(fmt::format("a frame of {} bytes (1 to {} allowed)", n, kMaxFrame));
    return n;
}

std::vector<uint8_t> encode_request(Msg type, SeqId seq, uint32_t n) {
    Request q;
    q.type = type;
    q.seq = seq;
    q.n = n;
    Writer w(type);
    request_fields(w, std::as_const(q));
    return std::move(w).frame();
}

std::vector<uint8_t> encode_park(SeqId seq, uint32_t n, uint64_t max_bytes) {
    Request q;
    q.type = Msg::Park;
    q.seq = seq;
    q.n = n;
    q.max_bytes = max_bytes;
    Writer w(q.type);
    request_fields(w, std::as_const(q));
    return std::move(w).frame();
}

std::vector<uint8_t> encode_unpark(uint64_t parked, std::span<const int32_t> tokens) {
    Request q;
    q.type = Msg::Unpark;
    q.parked = parked;
    q.tokens.assign(tokens.begin(), tokens.end());
    Writer w(q.type);
    request_fields(w, std::as_const(q));
    return std::move(w).frame();
}

std::vector<uint8_t> encode_drop_parked(uint64_t parked) {
    Request q;
    q.type = Msg::DropParked;
    q.parked = parked;
    Writer w(q.type);
    request_fields(w, std::as_const(q));
    return std::move(w).frame();
}

std::vector<uint8_t> encode_kv_init(const KvBudget& b) {
    Writer w(Msg::KvInit);
    budget_fields(w, b);
    return std::move(w).frame();
}

std::vector<uint8_t> encode_set_sampling(SeqId seq, const eh_sampling_params& p) {
    Writer w(Msg::SetSampling);
    w.field(seq);
    sampling_fields(w, p);
    return std::move(w).frame();
}

std::vector<uint8_t> encode_step(std::span<const StepItem> items) {
    Writer w(Msg::Step);
    w.field(uint32_t(items.size()));
    for (const StepItem& it : items) {
        w.field(it.seq);
        w.field(uint8_t((it.sample ? 1 : 0) | (it.logits ? 2 : 0) | (it.allowed ? 4 : 0) | (it.verify ? 8 : 0)));
        w.array(it.tokens);
        if (it.allowed) w.array(std::span<const uint32_t>(*it.allowed));
        const uint32_t nb = it.bias ? uint32_t(it.bias->size()) : 0;
        w.field(nb);
        for (uint32_t i = 0; i < nb; ++i) {
            w.field((*it.bias)[i].first);
            w.field((*it.bias)[i].second);
        }
    }
    return std::move(w).frame();
}

Request decode_request(std::span<const uint8_t> body) {
    Reader r(body);
    Request q;
    r.field(q.type);
    if (q.type != Msg::Step) {
        request_fields(r, q);
        if (q.type == Msg::SetSampling) q.sampling.struct_size = sizeof(q.sampling);
        r.end();
        return q;
    }
    uint32_t n;
    r.count(n, kMaxEntries, 17, "step entries");  // a sequence, flags and two counts
    if (n == 0) throw ProtocolError("a step of no entries");
    q.entries.resize(n);
    for (StepEntry& e : q.entries) {
        r.field(e.seq);
        uint8_t flags;
        r.field(flags);
        if (flags > 15) throw ProtocolError(fmt::format("step entry flags {:#x}", flags));
        e.sample = flags & 1;
        e.logits = flags & 2;
        e.verify = flags & 8;
        r.array(e.tokens, kMaxFrame / 4, "tokens");
        if (e.tokens.empty()) throw ProtocolError("a step entry with no tokens");
        if (flags & 4) r.array(e.allowed.emplace(), kMaxVocab / 32, "mask words");
        uint32_t nb;
        r.count(nb, kMaxVocab, 8, "logit biases");
        e.bias.resize(nb);
        for (auto& [t, v] : e.bias) {
            r.field(t);
            r.field(v);
        }
    }
    r.end();
    return q;
}

std::vector<uint8_t> encode_reply(const Reply& q) {
    Writer w(q.type);
    reply_fields(w, q);
    return std::move(w).frame();
}

Reply decode_reply(std::span<const uint8_t> body) {
    Reader r(body);
    Reply q;
    r.field(q.type);
    reply_fields(r, q);
    r.end();
    return q;
}

namespace {

// Reads exactly `n` bytes. An abandoned read loses the stream's place: the
// caller gives up on the connection.
Io read_exact(int fd, uint8_t* p, size_t n, const std::function<bool()>& keep_waiting) {
    while (n > 0) {
        pollfd pf{fd, POLLIN, 0};
        const int r = ::poll(&pf, 1, 50);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return Io::Closed;
        if (r == 0) {
            if (keep_waiting && !keep_waiting()) return Io::Abandoned;
            continue;
        }
        const ssize_t got = ::read(fd, p, n);
        if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (got <= 0) return Io::Closed;
        p += got;
        n -= size_t(got);
    }
    return Io::Ok;
}

}  // namespace

Io write_frame(int fd, std::span<const uint8_t> frame, const std::function<bool()>& keep_waiting) {
    const uint8_t* p = frame.data();
    size_t n = frame.size();
    while (n > 0) {
        const ssize_t put = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (put < 0 && errno == EINTR) continue;
        if (put < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            // A peer that stopped reading (a hung engine) must not hold the writer.
            pollfd pf{fd, POLLOUT, 0};
            const int r = ::poll(&pf, 1, 50);
            if (r == 0 && keep_waiting && !keep_waiting()) return Io::Abandoned;
            continue;
        }
        if (put <= 0) return Io::Closed;
        p += put;
        n -= size_t(put);
    }
    return Io::Ok;
}

Io read_frame(int fd, std::vector<uint8_t>& body, const std::function<bool()>& keep_waiting) {
    uint8_t header[4];
    if (Io r = read_exact(fd, header, 4, keep_waiting); r != Io::Ok) return r;
    body.resize(frame_length(header));
    return read_exact(fd, body.data(), body.size(), keep_waiting);
}

}  // namespace eh::service::wire
