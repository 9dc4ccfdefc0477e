// KV events in process: the block hash against vectors computed outside
// this code base (Python's hashlib over hand-written CBOR), the block index's
// refcounted stores and removals, and the msgpack wire format.
#include <gtest/gtest.h>

#include <msgpack.hpp>

#include <numeric>

#include "eh/service/kv_events.hpp"
#include "kv_events/encode.hpp"

using namespace eh::service;

namespace {

struct Recorder : KvEventSink {
    std::vector<std::vector<KvEvent>> batches;
    void publish(std::vector<KvEvent> b) override { batches.push_back(std::move(b)); }
};

std::vector<int32_t> iota_tokens(size_t n, int32_t from) {
    std::vector<int32_t> t(n);
    std::iota(t.begin(), t.end(), from);
    return t;
}

// Python: low64 = int.from_bytes(sha256(b).digest()[24:32], "big") over
// b"\x60" (CBOR ""), b"\x62" b"42", and [root, [1, 2, 3], null] /
// [h1, [0, 23, 24, 255, 256, 65535, 65536, 100000], null] in canonical CBOR.
TEST(KvHash, MatchesVectorsComputedElsewhere) {
    const uint64_t root = kv_root_hash("");
    EXPECT_EQ(root, 0x0ad38662763f13d3ull);
    EXPECT_EQ(kv_root_hash("42"), 0xa74ffcc4f31c1780ull);
    const std::vector<int32_t> a = {1, 2, 3};
    const uint64_t h1 = kv_block_hash(root, a);
    EXPECT_EQ(h1, 0x95876bc09a95e185ull);
    // Every CBOR integer width among the token ids.
    const std::vector<int32_t> b = {0, 23, 24, 255, 256, 65535, 65536, 100000};
    EXPECT_EQ(kv_block_hash(h1, b), 0x6f1264bbeb7a18f0ull);
}

TEST(KvBlockIndex, StoresNewBlocksOnceAndRemovesThemWithTheirLastHolder) {
    auto rec = std::make_shared<Recorder>();
    KvBlockIndex index(rec, 4, "");
    const std::vector<int32_t> first = iota_tokens(10, 100);  // 2 full blocks, 2 tokens left over
    index.add(first);
    ASSERT_EQ(rec->batches.size(), 1u);
    const KvEvent& s1 = rec->batches[0][0];
    EXPECT_EQ(s1.kind, KvEvent::Kind::BlockStored);
    ASSERT_EQ(s1.hashes.size(), 2u);
    EXPECT_FALSE(s1.parent.has_value());
    EXPECT_EQ(s1.tokens, std::vector<int32_t>(first.begin(), first.begin() + 8));
    EXPECT_EQ(s1.block_tokens, 4u);
    const uint64_t root = kv_root_hash("");
    EXPECT_EQ(s1.hashes[0], kv_block_hash(root, std::span(first).subspan(0, 4)));
    EXPECT_EQ(s1.hashes[1], kv_block_hash(s1.hashes[0], std::span(first).subspan(4, 4)));

    // Sharing the first block, then diverging: only the new blocks, chained
    // to the shared one.
    std::vector<int32_t> second(first.begin(), first.begin() + 4);
    for (int32_t t : iota_tokens(8, 500)) second.push_back(t);
    index.add(second);
    ASSERT_EQ(rec->batches.size(), 2u);
    const KvEvent& s2 = rec->batches[1][0];
    ASSERT_EQ(s2.hashes.size(), 2u);
    EXPECT_EQ(s2.parent, s1.hashes[0]);
    EXPECT_EQ(s2.tokens, std::vector<int32_t>(second.begin() + 4, second.end()));
    EXPECT_EQ(index.blocks(), 4u);

    // The first leaves: its own block goes, the shared one stays.
    index.remove(first);
    ASSERT_EQ(rec->batches.size(), 3u);
    EXPECT_EQ(rec->batches[2][0].kind, KvEvent::Kind::BlockRemoved);
    EXPECT_EQ(rec->batches[2][0].hashes, std::vector<uint64_t>{s1.hashes[1]});
    // A sequence shorter than a block holds none: no event.
    index.add(iota_tokens(3, 7));
    index.remove(iota_tokens(3, 7));
    EXPECT_EQ(rec->batches.size(), 3u);
    // The second leaves: deepest first.
    index.remove(second);
    ASSERT_EQ(rec->batches.size(), 4u);
    EXPECT_EQ(rec->batches[3][0].hashes, (std::vector<uint64_t>{s2.hashes[1], s2.hashes[0], s1.hashes[0]}));
    EXPECT_EQ(index.blocks(), 0u);
}

TEST(KvBlockIndex, ClearNamesEveryHeldBlockThenAllBlocksCleared) {
    auto rec = std::make_shared<Recorder>();
    KvBlockIndex index(rec, 4, "seed");
    index.add(iota_tokens(8, 1));
    index.clear();
    ASSERT_EQ(rec->batches.size(), 2u);
    ASSERT_EQ(rec->batches[1].size(), 2u);
    EXPECT_EQ(rec->batches[1][0].kind, KvEvent::Kind::BlockRemoved);
    EXPECT_EQ(rec->batches[1][0].hashes.size(), 2u);
    EXPECT_EQ(rec->batches[1][1].kind, KvEvent::Kind::AllBlocksCleared);
    index.clear();  // nothing held: AllBlocksCleared alone
    ASSERT_EQ(rec->batches.size(), 3u);
    ASSERT_EQ(rec->batches[2].size(), 1u);
    EXPECT_EQ(rec->batches[2][0].kind, KvEvent::Kind::AllBlocksCleared);
}

// The batch decodes as vLLM's array-encoded EventBatch and tagged events.
TEST(KvWire, BatchIsVllmsArrayLayout) {
    KvEvent stored;
    stored.kind = KvEvent::Kind::BlockStored;
    stored.hashes = {0xFFFFFFFFFFFFFFFFull, 7};
    stored.parent = 0x0123456789ABCDEFull;
    stored.tokens = {1, 300, 70000};
    stored.block_tokens = 16;
    KvEvent removed;
    removed.kind = KvEvent::Kind::BlockRemoved;
    removed.hashes = {42};
    KvEvent cleared;
    cleared.kind = KvEvent::Kind::AllBlocksCleared;
    const std::string wire = kv_wire::encode_batch(1733000000.25, {stored, removed, cleared}, "GPU", 0);
    msgpack::object_handle oh = msgpack::unpack(wire.data(), wire.size());
    const msgpack::object& batch = oh.get();
    ASSERT_EQ(batch.type, msgpack::type::ARRAY);
    ASSERT_EQ(batch.via.array.size, 3u);
    EXPECT_EQ(batch.via.array.ptr[0].type, msgpack::type::FLOAT64);
    EXPECT_EQ(batch.via.array.ptr[0].as<double>(), 1733000000.25);
    EXPECT_EQ(batch.via.array.ptr[2].as<int>(), 0);
    const msgpack::object& events = batch.via.array.ptr[1];
    ASSERT_EQ(events.via.array.size, 3u);

    const msgpack::object& s = events.via.array.ptr[0];
    ASSERT_EQ(s.via.array.size, 8u);
    EXPECT_EQ(s.via.array.ptr[0].as<std::string>(), "BlockStored");
    EXPECT_EQ(s.via.array.ptr[1].as<std::vector<uint64_t>>(), stored.hashes);
    EXPECT_EQ(s.via.array.ptr[2].type, msgpack::type::POSITIVE_INTEGER);
    EXPECT_EQ(s.via.array.ptr[2].as<uint64_t>(), *stored.parent);
    EXPECT_EQ(s.via.array.ptr[3].as<std::vector<uint32_t>>(), (std::vector<uint32_t>{1, 300, 70000}));
    EXPECT_EQ(s.via.array.ptr[4].as<int>(), 16);
    EXPECT_EQ(s.via.array.ptr[5].type, msgpack::type::NIL);  // lora_id
    EXPECT_EQ(s.via.array.ptr[6].as<std::string>(), "GPU");
    EXPECT_EQ(s.via.array.ptr[7].type, msgpack::type::NIL);  // lora_name

    const msgpack::object& r = events.via.array.ptr[1];
    ASSERT_EQ(r.via.array.size, 3u);
    EXPECT_EQ(r.via.array.ptr[0].as<std::string>(), "BlockRemoved");
    EXPECT_EQ(r.via.array.ptr[1].as<std::vector<uint64_t>>(), std::vector<uint64_t>{42});
    EXPECT_EQ(r.via.array.ptr[2].as<std::string>(), "GPU");

    const msgpack::object& c = events.via.array.ptr[2];
    ASSERT_EQ(c.via.array.size, 1u);
    EXPECT_EQ(c.via.array.ptr[0].as<std::string>(), "AllBlocksCleared");

    // A first block has no parent: nil.
    stored.parent.reset();
    const std::string w2 = kv_wire::encode_batch(0, {stored}, "CPU", 0);
    msgpack::object_handle oh2 = msgpack::unpack(w2.data(), w2.size());
    EXPECT_EQ(oh2.get().via.array.ptr[1].via.array.ptr[0].via.array.ptr[2].type, msgpack::type::NIL);
}

}  // namespace
