// The engine process's side of the protocol: the SeqEngine of a model
// loaded here, answering one request at a time.
#include <unistd.h>

#include <fmt/format.h>

#include "engine_wire.hpp"
#include "eh/service/event_log.hpp"
#include "eh/service/remote_engine.hpp"

namespace eh::service {
namespace {

void send(int fd, const wire::Reply& r) { wire::write_frame(fd, wire::encode_reply(r)); }

wire::Reply answer(wire::Request& q, const std::shared_ptr<EngineModel>& model,
                   const std::vector<std::shared_ptr<EngineAdapter>>& adapters, std::unique_ptr<SeqEngine>& engine) {
    wire::Reply r;
    r.type = q.type;
    if (q.type == wire::Msg::Ping) return r;  // this process is not stuck: no plugin call
    if (q.type == wire::Msg::Residency) {
        r.resident = model->check_residency(&r.message);
        return r;
    }
    if (q.type == wire::Msg::KvInit) {
        if (engine) throw Error(Code::Internal, "the KV cache is already made");
        engine = make_seq_engine(model, q.budget, adapters);
        r.limits = engine->limits();
        r.has_logits = engine->has_logits();
        r.can_park = engine->can_park();
        r.device_bytes = model->info().device_bytes_used;
        r.free_blocks = engine->free_blocks();
        return r;
    }
    if (!engine) throw Error(Code::Internal, "no KV cache yet");
    switch (q.type) {
    case wire::Msg::Create: r.seq = engine->create(); break;
    case wire::Msg::Fork: r.seq = engine->fork(q.seq, q.n); break;
    case wire::Msg::Truncate: engine->truncate(q.seq, q.n); break;
    case wire::Msg::Release: engine->release(q.seq); break;
    case wire::Msg::SetSampling: engine->set_sampling(q.seq, q.sampling); break;
    case wire::Msg::SetAdapter: engine->set_adapter(q.seq, q.n); break;
    case wire::Msg::Park: {
        const SeqEngine::Parked p = engine->park(q.seq, q.n, q.max_bytes);
        r.parked = p.id;
        r.parked_bytes = p.bytes;
        break;
    }
    case wire::Msg::Unpark: r.seq = engine->unpark(q.parked, q.tokens); break;
    case wire::Msg::DropParked: engine->drop_parked(q.parked); break;
    case wire::Msg::Step: {
        // The plugin reads a mask of the whole vocabulary: a shorter one
        // would be read past its end.
        const size_t words = (size_t(model->info().vocab_size) + 31) / 32;
        std::vector<StepItem> items(q.entries.size());
        for (size_t i = 0; i < items.size(); ++i) {
            wire::StepEntry& e = q.entries[i];
            if (e.allowed && e.allowed->size() != words)
                throw Error(Code::Internal, fmt::format("an allowed-token mask of {} words for {} tokens",
                                                        e.allowed->size(), model->info().vocab_size));
            items[i].seq = e.seq;
            items[i].tokens = e.tokens;
            items[i].sample = e.sample;
            items[i].logits = e.logits;
            items[i].verify = e.verify;
            items[i].allowed = e.allowed ? &*e.allowed : nullptr;
            items[i].bias = e.bias.empty() ? nullptr : &e.bias;
        }
        r.kv_full = !engine->step(items);
        if (!r.kv_full) {
            r.tokens.resize(items.size());
            r.accepted.resize(items.size());
            r.logits.resize(items.size());
            for (size_t i = 0; i < items.size(); ++i) {
                r.tokens[i] = items[i].token;
                r.accepted[i] = items[i].n_accepted;
                if (!items[i].logits) continue;
                const std::span<const float> l = engine->logits(items[i].seq);
                r.logits[i].assign(l.begin(), l.end());
            }
        }
        break;
    }
    default: throw Error(Code::Internal, "not a request");
    }
    r.free_blocks = engine->free_blocks();
    return r;
}

}  // namespace

void send_load_progress(int fd, float fraction, const std::string& stage) {
    wire::Reply r;
    r.type = wire::Msg::Progress;
    r.progress = fraction;
    r.message = stage;
    send(fd, r);
}

void send_ready(int fd, const EngineFacts& facts) {
    wire::Reply r;
    r.type = wire::Msg::Ready;
    r.facts = facts;
    send(fd, r);
}

void send_load_failed(int fd, const Error& e) {
    wire::Reply r;
    r.type = wire::Msg::LoadFailed;
    r.code = e.code();
    r.message = e.what();
    send(fd, r);
}

int serve_engine_requests(int fd, std::shared_ptr<EngineModel> model, int64_t parent_pid,
                          std::vector<std::shared_ptr<EngineAdapter>> adapters) {
    std::unique_ptr<SeqEngine> engine;
    std::vector<uint8_t> body;
    const auto parent_alive = [parent_pid] { return int64_t(getppid()) == parent_pid; };
    for (;;) {
        wire::Reply r;
        try {
            if (wire::read_frame(fd, body, parent_alive) != wire::Io::Ok) return 0;  // the parent closed or died
            wire::Request q = wire::decode_request(body);
            try {
                r = answer(q, model, adapters, engine);
            } catch (const Error& e) {
                r = {};
                r.type = wire::Msg::Error;
                r.code = e.code();
                r.message = e.what();
            } catch (const std::exception& e) {
                r = {};
                r.type = wire::Msg::Error;
                r.code = Code::Internal;
                r.message = e.what();
            }
        } catch (const wire::ProtocolError& e) {
            // Out of step with the parent: nothing after this can be trusted.
            log_event(spdlog::level::err, "error", {{"code", "INTERNAL"}, {"message", e.what()}});
            return 1;
        }
        if (wire::write_frame(fd, wire::encode_reply(r)) != wire::Io::Ok) return 0;
    }
}

}  // namespace eh::service
