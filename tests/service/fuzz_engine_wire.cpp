// libFuzzer target: arbitrary bytes through the engine process's protocol
// decoders (host/service/src/engine_wire.cpp). The first byte picks the
// side: odd, the parent's reply decoder; even, the child's request decoder;
// the rest is a message body. A decoder may only return or throw
// ProtocolError; what it returns must encode and decode again to the same
// bytes. The frame header check sees the body's first four bytes.
//   ./fuzz_engine_wire -max_total_time=60 fuzz_engine_wire_seeds
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "engine_wire.hpp"

using namespace eh::service;
using namespace eh::service::wire;

namespace {

std::vector<uint8_t> encode(const Request& q) {
    switch (q.type) {
    case Msg::KvInit: return encode_kv_init(q.budget);
    case Msg::SetSampling: return encode_set_sampling(q.seq, q.sampling);
    case Msg::Step: {
        std::vector<StepItem> items(q.entries.size());
        for (size_t i = 0; i < items.size(); ++i) {
            const StepEntry& e = q.entries[i];
            items[i].seq = e.seq;
            items[i].tokens = e.tokens;
            items[i].sample = e.sample;
            items[i].logits = e.logits;
            items[i].verify = e.verify;
            items[i].allowed = e.allowed ? &*e.allowed : nullptr;
            items[i].bias = &e.bias;
        }
        return encode_step(items);
    }
    case Msg::Park: return encode_park(q.seq, q.n, q.max_bytes);
    case Msg::Unpark: return encode_unpark(q.parked, q.tokens);
    case Msg::DropParked: return encode_drop_parked(q.parked);
    default: return encode_request(q.type, q.seq, q.n);
    }
}

std::span<const uint8_t> body_of(const std::vector<uint8_t>& frame) {
    if (frame.size() < 4 || frame_length(frame.data()) != frame.size() - 4) std::abort();
    return std::span<const uint8_t>(frame).subspan(4);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const std::span<const uint8_t> body(data + 1, size - 1);
    if (body.size() >= 4) {
        try {
            (void)frame_length(body.data());
        } catch (const ProtocolError&) {
        }
    }
    try {
        if (data[0] & 1) {
            const std::vector<uint8_t> once = encode_reply(decode_reply(body));
            const std::vector<uint8_t> twice = encode_reply(decode_reply(body_of(once)));
            if (once != twice) std::abort();
        } else {
            const Request q = decode_request(body);
            const std::vector<uint8_t> again = encode(q);
            // Requests have one encoding: the same bytes come back.
            const std::span<const uint8_t> b = body_of(again);
            if (!std::equal(b.begin(), b.end(), body.begin(), body.end())) std::abort();
        }
    } catch (const ProtocolError&) {
    }
    return 0;
}
