#include "encode.hpp"

#include <msgpack.hpp>

namespace eh::service::kv_wire {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void pack_str(Packer& pk, const std::string& s) {
    pk.pack_str(uint32_t(s.size()));
    pk.pack_str_body(s.data(), uint32_t(s.size()));
}

void pack_hashes(Packer& pk, const std::vector<uint64_t>& hashes) {
    pk.pack_array(uint32_t(hashes.size()));
    for (uint64_t h : hashes) pk.pack_uint64(h);
}

void pack_event(Packer& pk, const KvEvent& e, const std::string& medium) {
    switch (e.kind) {
    case KvEvent::Kind::BlockStored:
        pk.pack_array(8);
        pack_str(pk, "BlockStored");
        pack_hashes(pk, e.hashes);
        if (e.parent) pk.pack_uint64(*e.parent);
        else pk.pack_nil();
        pk.pack_array(uint32_t(e.tokens.size()));
        for (int32_t t : e.tokens) pk.pack_uint32(uint32_t(t));
        pk.pack_uint32(e.block_tokens);
        pk.pack_nil();  // lora_id
        pack_str(pk, medium);
        pk.pack_nil();  // lora_name
        return;
    case KvEvent::Kind::BlockRemoved:
        pk.pack_array(3);
        pack_str(pk, "BlockRemoved");
        pack_hashes(pk, e.hashes);
        pack_str(pk, medium);
        return;
    case KvEvent::Kind::AllBlocksCleared:
        pk.pack_array(1);
        pack_str(pk, "AllBlocksCleared");
        return;
    }
}

}  // namespace

std::string encode_batch(double ts, const std::vector<KvEvent>& events, const std::string& medium, int dp_rank) {
    msgpack::sbuffer buf;
    Packer pk(&buf);
    pk.pack_array(3);
    pk.pack_double(ts);
    pk.pack_array(uint32_t(events.size()));
    for (const KvEvent& e : events) pack_event(pk, e, medium);
    pk.pack_int32(dp_rank);
    return std::string(buf.data(), buf.size());
}

}  // namespace eh::service::kv_wire
