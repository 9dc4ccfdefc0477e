#include "engine_wire.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <type_traits>

namespace eh::service::wire {
namespace {

class Writer {
public:
    explicit Writer(Msg type) {
        buf_.resize(4);
        put<uint8_t>(uint8_t(type));
    }
    template <class T>
    void put(T v) {
        static_assert(std::is_trivially_copyable_v<T>);
        const size_t at = buf_.size();
        buf_.resize(at + sizeof(T));
        std::memcpy(buf_.data() + at, &v, sizeof(T));
    }
    template <class T>
    void put_array(std::span<const T> v) {
        put<uint32_t>(uint32_t(v.size()));
        const size_t at = buf_.size();
        buf_.resize(at + v.size_bytes());
        if (!v.empty()) std::memcpy(buf_.data() + at, v.data(), v.size_bytes());
    }
    void put_string(const std::string& s) {
        const std::string& t = s.size() > kMaxString ? s.substr(0, kMaxString) : s;
        put_array(std::span<const char>(t.data(), t.size()));
    }
    std::vector<uint8_t> frame() && {
        const size_t body = buf_.size() - 4;
        if (body > kMaxFrame) throw ProtocolError(fmt::format("a {}-byte message is over the {}-byte limit", body, kMaxFrame));
        const uint32_t n = uint32_t(body);
        std::memcpy(buf_.data(), &n, 4);
        return std::move(buf_);
    }

private:
    std::vector<uint8_t> buf_;
};

class Reader {
public:
    explicit Reader(std::span<const uint8_t> b) : b_(b) {
        if (b_.empty()) throw ProtocolError("an empty message");
        if (b_.size() > kMaxFrame) throw ProtocolError("a message over the frame limit");
    }
    template <class T>
    T get() {
        static_assert(std::is_trivially_copyable_v<T>);
        need(sizeof(T));
        T v;
        std::memcpy(&v, b_.data() + at_, sizeof(T));
        at_ += sizeof(T);
        return v;
    }
    bool flag() {
        const uint8_t v = get<uint8_t>();
        if (v > 1) throw ProtocolError(fmt::format("a flag of {}", v));
        return v == 1;
    }
    template <class T>
    std::vector<T> array(uint32_t max, const char* what) {
        const uint32_t n = get<uint32_t>();
        if (n > max) throw ProtocolError(fmt::format("{} {} over the limit of {}", n, what, max));
        need(size_t(n) * sizeof(T));
        std::vector<T> v(n);
        if (n) std::memcpy(v.data(), b_.data() + at_, size_t(n) * sizeof(T));
        at_ += size_t(n) * sizeof(T);
        return v;
    }
    std::string string() {
        const std::vector<char> c = array<char>(kMaxString, "string bytes");
        return {c.begin(), c.end()};
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

Code code_from_wire(uint32_t c) {
    if (c > uint32_t(Code::EngineCrashed)) throw ProtocolError(fmt::format("an error code of {}", c));
    return Code(c);
}

template <size_t N>
void put_fixed(Writer& w, const char (&s)[N]) {
    w.put_string(std::string(s, strnlen(s, N)));
}
template <size_t N>
void get_fixed(Reader& r, char (&s)[N]) {
    const std::string v = r.string();
    if (v.size() >= N) throw ProtocolError(fmt::format("a {}-byte name where at most {} fit", v.size(), N - 1));
    std::memset(s, 0, N);
    std::memcpy(s, v.data(), v.size());
}

}  // namespace

uint32_t frame_length(const uint8_t header[4]) {
    uint32_t n;
    std::memcpy(&n, header, 4);
    if (n == 0 || n > kMaxFrame) throw ProtocolError(fmt::format("a frame of {} bytes (1 to {} allowed)", n, kMaxFrame));
    return n;
}

std::vector<uint8_t> encode_request(Msg type, SeqId seq, uint32_t n) {
    Writer w(type);
    if (type == Msg::Fork || type == Msg::Truncate || type == Msg::Release) w.put<uint64_t>(seq);
    if (type == Msg::Fork || type == Msg::Truncate) w.put<uint32_t>(n);
    return std::move(w).frame();
}

std::vector<uint8_t> encode_kv_init(const KvBudget& b) {
    Writer w(Msg::KvInit);
    w.put<uint32_t>(b.max_seqs);
    w.put<uint32_t>(b.max_step_tokens);
    w.put<uint32_t>(b.max_seq_tokens);
    w.put<uint64_t>(b.budget_bytes);
    w.put<float>(b.memory_fraction);
    return std::move(w).frame();
}

std::vector<uint8_t> encode_set_sampling(SeqId seq, const eh_sampling_params& p) {
    Writer w(Msg::SetSampling);
    w.put<uint64_t>(seq);
    w.put<float>(p.temperature);
    w.put<int32_t>(p.top_k);
    w.put<float>(p.top_p);
    w.put<float>(p.min_p);
    w.put<float>(p.repetition_penalty);
    w.put<int32_t>(p.repetition_window);
    w.put<uint64_t>(p.seed);
    w.put<float>(p.presence_penalty);
    w.put<float>(p.frequency_penalty);
    return std::move(w).frame();
}

std::vector<uint8_t> encode_step(std::span<const StepItem> items) {
    Writer w(Msg::Step);
    w.put<uint32_t>(uint32_t(items.size()));
    for (const StepItem& it : items) {
        w.put<uint64_t>(it.seq);
        w.put<uint8_t>(uint8_t((it.sample ? 1 : 0) | (it.logits ? 2 : 0) | (it.allowed ? 4 : 0)));
        w.put_array(it.tokens);
        if (it.allowed) w.put_array(std::span<const uint32_t>(*it.allowed));
        const size_t nb = it.bias ? it.bias->size() : 0;
        w.put<uint32_t>(uint32_t(nb));
        for (size_t i = 0; i < nb; ++i) {
            w.put<int32_t>((*it.bias)[i].first);
            w.put<float>((*it.bias)[i].second);
        }
    }
    return std::move(w).frame();
}

Request decode_request(std::span<const uint8_t> body) {
    Reader r(body);
    Request q;
    q.type = Msg(r.get<uint8_t>());
    switch (q.type) {
    case Msg::KvInit:
        q.budget.max_seqs = r.get<uint32_t>();
        q.budget.max_step_tokens = r.get<uint32_t>();
        q.budget.max_seq_tokens = r.get<uint32_t>();
        q.budget.budget_bytes = r.get<uint64_t>();
        q.budget.memory_fraction = r.get<float>();
        break;
    case Msg::Create:
    case Msg::Residency:
        break;
    case Msg::Fork:
    case Msg::Truncate:
        q.seq = r.get<uint64_t>();
        q.n = r.get<uint32_t>();
        break;
    case Msg::Release:
        q.seq = r.get<uint64_t>();
        break;
    case Msg::SetSampling: {
        q.seq = r.get<uint64_t>();
        eh_sampling_params& p = q.sampling;
        p.struct_size = sizeof(p);
        p.temperature = r.get<float>();
        p.top_k = r.get<int32_t>();
        p.top_p = r.get<float>();
        p.min_p = r.get<float>();
        p.repetition_penalty = r.get<float>();
        p.repetition_window = r.get<int32_t>();
        p.seed = r.get<uint64_t>();
        p.presence_penalty = r.get<float>();
        p.frequency_penalty = r.get<float>();
        break;
    }
    case Msg::Step: {
        const uint32_t n = r.get<uint32_t>();
        if (n == 0 || n > kMaxEntries) throw ProtocolError(fmt::format("a step of {} entries (1 to {} allowed)", n, kMaxEntries));
        // Each entry takes at least 17 bytes: a count past what is left is a lie.
        if (size_t(n) * 17 > body.size()) throw ProtocolError(fmt::format("{} entries in a {}-byte message", n, body.size()));
        q.entries.resize(n);
        for (StepEntry& e : q.entries) {
            e.seq = r.get<uint64_t>();
            const uint8_t flags = r.get<uint8_t>();
            if (flags > 7) throw ProtocolError(fmt::format("step entry flags {:#x}", flags));
            e.sample = flags & 1;
            e.logits = flags & 2;
            e.tokens = r.array<int32_t>(kMaxFrame / 4, "tokens");
            if (e.tokens.empty()) throw ProtocolError("a step entry with no tokens");
            if (flags & 4) e.allowed = r.array<uint32_t>(kMaxVocab / 32, "mask words");
            const uint32_t nb = r.get<uint32_t>();
            if (nb > kMaxVocab) throw ProtocolError(fmt::format("{} logit biases", nb));
            if (size_t(nb) * 8 > body.size()) throw ProtocolError(fmt::format("{} biases in a {}-byte message", nb, body.size()));
            e.bias.resize(nb);
            for (auto& [t, v] : e.bias) {
                t = r.get<int32_t>();
                v = r.get<float>();
            }
        }
        break;
    }
    default:
        throw ProtocolError(fmt::format("unknown request type {}", uint8_t(q.type)));
    }
    r.end();
    return q;
}

std::vector<uint8_t> encode_reply(const Reply& q) {
    Writer w(q.type);
    switch (q.type) {
    case Msg::Progress:
        w.put<float>(q.progress);
        w.put_string(q.message);
        break;
    case Msg::Ready: {
        w.put<uint32_t>(kMagic);
        w.put<uint16_t>(kVersion);
        const eh_model_info& i = q.facts.info;
        put_fixed(w, i.architecture);
        put_fixed(w, i.quant_kind);
        w.put<uint32_t>(i.context_length);
        w.put<uint32_t>(i.vocab_size);
        w.put<uint64_t>(i.device_bytes_used);
        w.put<uint64_t>(i.host_bytes_used);
        put_fixed(w, i.device_name);
        w.put<int32_t>(i.compute_capability);
        w.put<int32_t>(i.runtime_version);
        w.put<uint64_t>(i.kv_bytes_per_token);
        w.put_string(q.facts.plugin_name);
        w.put_string(q.facts.plugin_version);
        w.put<uint8_t>(q.facts.session_logits);
        break;
    }
    case Msg::LoadFailed:
    case Msg::Error:
        w.put<uint32_t>(uint32_t(q.code));
        w.put_string(q.message);
        break;
    case Msg::KvInit: {
        const SeqLimits& l = q.limits;
        for (uint32_t v : {l.max_seqs, l.max_step_tokens, l.max_step_entries, l.max_seq_tokens, l.block_tokens, l.total_blocks})
            w.put<uint32_t>(v);
        w.put<uint64_t>(l.block_bytes);
        w.put<uint8_t>(l.can_fork);
        w.put<uint8_t>(l.batched);
        w.put<uint8_t>(q.has_logits);
        w.put<uint64_t>(q.device_bytes);
        w.put<uint32_t>(q.free_blocks);
        break;
    }
    case Msg::Create:
    case Msg::Fork:
        w.put<uint64_t>(q.seq);
        w.put<uint32_t>(q.free_blocks);
        break;
    case Msg::Truncate:
    case Msg::Release:
    case Msg::SetSampling:
        w.put<uint32_t>(q.free_blocks);
        break;
    case Msg::Step:
        w.put<uint8_t>(q.kv_full);
        w.put<uint32_t>(q.free_blocks);
        w.put<uint32_t>(uint32_t(q.tokens.size()));
        for (size_t i = 0; i < q.tokens.size(); ++i) {
            w.put<int32_t>(q.tokens[i]);
            static const std::vector<float> none;
            w.put_array(std::span<const float>(i < q.logits.size() ? q.logits[i] : none));
        }
        break;
    case Msg::Residency:
        w.put<uint8_t>(q.resident);
        w.put_string(q.message);
        break;
    }
    return std::move(w).frame();
}

Reply decode_reply(std::span<const uint8_t> body) {
    Reader r(body);
    Reply q;
    q.type = Msg(r.get<uint8_t>());
    switch (q.type) {
    case Msg::Progress:
        q.progress = r.get<float>();
        q.message = r.string();
        break;
    case Msg::Ready: {
        if (r.get<uint32_t>() != kMagic) throw ProtocolError("the engine process's greeting has the wrong magic number");
        if (const uint16_t v = r.get<uint16_t>(); v != kVersion)
            throw ProtocolError(fmt::format("the engine process speaks protocol version {}; this host speaks {}", v, kVersion));
        eh_model_info& i = q.facts.info;
        i.struct_size = sizeof(i);
        get_fixed(r, i.architecture);
        get_fixed(r, i.quant_kind);
        i.context_length = r.get<uint32_t>();
        i.vocab_size = r.get<uint32_t>();
        i.device_bytes_used = r.get<uint64_t>();
        i.host_bytes_used = r.get<uint64_t>();
        get_fixed(r, i.device_name);
        i.compute_capability = r.get<int32_t>();
        i.runtime_version = r.get<int32_t>();
        i.kv_bytes_per_token = r.get<uint64_t>();
        q.facts.plugin_name = r.string();
        q.facts.plugin_version = r.string();
        q.facts.session_logits = r.flag();
        if (i.vocab_size > kMaxVocab) throw ProtocolError(fmt::format("a vocabulary of {} tokens", i.vocab_size));
        break;
    }
    case Msg::LoadFailed:
    case Msg::Error:
        q.code = code_from_wire(r.get<uint32_t>());
        q.message = r.string();
        break;
    case Msg::KvInit: {
        SeqLimits& l = q.limits;
        for (uint32_t* v : {&l.max_seqs, &l.max_step_tokens, &l.max_step_entries, &l.max_seq_tokens, &l.block_tokens,
                            &l.total_blocks})
            *v = r.get<uint32_t>();
        l.block_bytes = r.get<uint64_t>();
        l.can_fork = r.flag();
        l.batched = r.flag();
        q.has_logits = r.flag();
        q.device_bytes = r.get<uint64_t>();
        q.free_blocks = r.get<uint32_t>();
        if (l.max_step_entries > kMaxEntries) throw ProtocolError(fmt::format("{} step entries granted", l.max_step_entries));
        break;
    }
    case Msg::Create:
    case Msg::Fork:
        q.seq = r.get<uint64_t>();
        q.free_blocks = r.get<uint32_t>();
        break;
    case Msg::Truncate:
    case Msg::Release:
    case Msg::SetSampling:
        q.free_blocks = r.get<uint32_t>();
        break;
    case Msg::Step: {
        q.kv_full = r.flag();
        q.free_blocks = r.get<uint32_t>();
        const uint32_t n = r.get<uint32_t>();
        if (n > kMaxEntries) throw ProtocolError(fmt::format("a step reply of {} entries", n));
        if (size_t(n) * 8 > body.size()) throw ProtocolError(fmt::format("{} entries in a {}-byte reply", n, body.size()));
        q.tokens.resize(n);
        q.logits.resize(n);
        for (uint32_t i = 0; i < n; ++i) {
            q.tokens[i] = r.get<int32_t>();
            q.logits[i] = r.array<float>(kMaxVocab, "logits");
        }
        break;
    }
    case Msg::Residency:
        q.resident = r.flag();
        q.message = r.string();
        break;
    default:
        throw ProtocolError(fmt::format("unknown reply type {}", uint8_t(q.type)));
    }
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

Io write_frame(int fd, std::span<const uint8_t> frame) {
    const uint8_t* p = frame.data();
    size_t n = frame.size();
    while (n > 0) {
        const ssize_t put = ::send(fd, p, n, MSG_NOSIGNAL);
        if (put < 0 && errno == EINTR) continue;
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
