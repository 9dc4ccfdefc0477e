// Small GGUF images the model tests (and the fuzz seed generator) build
// themselves: a valid one written by GgufWriter, and a raw byte builder for
// hostile headers the writer refuses to produce.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "eh/model/gguf_writer.hpp"

namespace eh::model::testing {

// Appends little-endian fields.
struct Bytes {
    std::vector<uint8_t> b;
    Bytes& raw(const void* p, size_t n) {
        const uint8_t* q = static_cast<const uint8_t*>(p);
        b.insert(b.end(), q, q + n);
        return *this;
    }
    Bytes& u8(uint8_t v) { return raw(&v, 1); }
    Bytes& u32(uint32_t v) { return raw(&v, 4); }
    Bytes& u64(uint64_t v) { return raw(&v, 8); }
    Bytes& f32(float v) { return raw(&v, 4); }
    Bytes& str(std::string_view s) { u64(s.size()); return raw(s.data(), s.size()); }
    Bytes& header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
        raw("GGUF", 4);
        u32(version);
        u64(n_tensors);
        return u64(n_kv);
    }
    Bytes& kv_u32(std::string_view key, uint32_t v) { str(key); u32(EH_VALUE_U32); return u32(v); }
    Bytes& kv_str(std::string_view key, std::string_view v) { str(key); u32(EH_VALUE_STRING); return str(v); }
    Bytes& tensor_info(std::string_view name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
        str(name);
        u32(static_cast<uint32_t>(dims.size()));
        for (uint64_t d : dims) u64(d);
        u32(type);
        return u64(offset);
    }
    Bytes& pad(size_t align = 32) {
        while (b.size() % align) b.push_back(0);
        return *this;
    }
    Bytes& zeros(size_t n) {
        b.insert(b.end(), n, 0);
        return *this;
    }
};

// A small valid model: every metadata value type, nested arrays, and tensors
// of three types (F32, F16, Q8_0).
inline GgufWriter small_model_writer(uint32_t alignment = 32) {
    static std::vector<uint8_t> payload(4096, 0x3c);
    GgufWriter w(alignment);
    w.set("general.architecture", GgufValue::string("llama"));
    w.set("general.name", GgufValue::string("tiny test"));
    w.set("llama.block_count", GgufValue::u32(1));
    w.set("llama.context_length", GgufValue::u32(128));
    w.set("llama.embedding_length", GgufValue::u32(32));
    w.set("llama.feed_forward_length", GgufValue::u32(64));
    w.set("llama.attention.head_count", GgufValue::u32(4));
    w.set("llama.attention.head_count_kv", GgufValue::u32(2));
    w.set("llama.attention.layer_norm_rms_epsilon", GgufValue::f32(1e-5f));
    w.set("llama.rope.freq_base", GgufValue::f32(10000.0f));
    w.set("test.u8", GgufValue::u8(200));
    w.set("test.i8", GgufValue::i8(-100));
    w.set("test.u16", GgufValue::u16(60000));
    w.set("test.i16", GgufValue::i16(-30000));
    w.set("test.i32", GgufValue::i32(-2000000000));
    w.set("test.u64", GgufValue::u64(uint64_t(1) << 40));
    w.set("test.i64", GgufValue::i64(-(int64_t(1) << 40)));
    w.set("test.f64", GgufValue::f64(0.125));
    w.set("test.bool", GgufValue::boolean(true));
    w.set("test.string_with_nul", GgufValue::string(std::string_view("a\0b", 3)));
    std::vector<float> scores = {0.5f, -1.0f, 2.0f};
    w.set("tokenizer.ggml.scores", GgufValue::array(std::span<const float>(scores)));
    std::vector<int32_t> types = {1, 3, 6};
    w.set("tokenizer.ggml.token_type", GgufValue::array(std::span<const int32_t>(types)));
    w.set("tokenizer.ggml.tokens", GgufValue::string_array({"<unk>", "hello", ""}));
    std::vector<uint8_t> bools = {1, 0, 1};
    w.set("test.bool_array", GgufValue::numeric_array(EH_VALUE_BOOL, bools.data(), bools.size()));
    std::vector<uint16_t> u16s = {1, 2};
    std::vector<double> f64s = {1.5};
    w.set("test.nested", GgufValue::array_of_arrays(
                             {GgufValue::numeric_array(EH_VALUE_U16, u16s.data(), u16s.size()),
                              GgufValue::string_array({"x", "yz"}),
                              GgufValue::array_of_arrays({GgufValue::numeric_array(EH_VALUE_F64, f64s.data(), 1)})}));
    w.add_tensor("token_embd.weight", EH_TYPE_F16, {32, 3}, payload.data());
    w.add_tensor("blk.0.attn_norm.weight", EH_TYPE_F32, {32}, payload.data());
    w.add_tensor("blk.0.attn_q.weight", EH_TYPE_Q8_0, {32, 32}, payload.data());
    w.add_tensor("output_norm.weight", EH_TYPE_F32, {32}, payload.data());
    return w;
}

inline std::vector<uint8_t> small_model_bytes(uint32_t alignment = 32) {
    return small_model_writer(alignment).to_bytes();
}

}  // namespace eh::model::testing
