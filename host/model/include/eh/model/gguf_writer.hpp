// A GGUF v3 writer (little-endian). Metadata and tensor descriptions are
// collected in memory; tensor bytes are streamed to the output one tensor at
// a time when write() runs, so a large model never has to fit in memory.
// Used by the tests and by the model-forging tool.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <engine_host/plugin_abi.h>

namespace eh::model {

// One metadata value to write, of any GGUF value type.
class GgufValue {
public:
    static GgufValue u8(uint8_t v) { return scalar(EH_VALUE_U8, &v, 1); }
    static GgufValue i8(int8_t v) { return scalar(EH_VALUE_I8, &v, 1); }
    static GgufValue u16(uint16_t v) { return scalar(EH_VALUE_U16, &v, 2); }
    static GgufValue i16(int16_t v) { return scalar(EH_VALUE_I16, &v, 2); }
    static GgufValue u32(uint32_t v) { return scalar(EH_VALUE_U32, &v, 4); }
    static GgufValue i32(int32_t v) { return scalar(EH_VALUE_I32, &v, 4); }
    static GgufValue u64(uint64_t v) { return scalar(EH_VALUE_U64, &v, 8); }
    static GgufValue i64(int64_t v) { return scalar(EH_VALUE_I64, &v, 8); }
    static GgufValue f32(float v) { return scalar(EH_VALUE_F32, &v, 4); }
    static GgufValue f64(double v) { return scalar(EH_VALUE_F64, &v, 8); }
    static GgufValue boolean(bool v) { uint8_t b = v ? 1 : 0; return scalar(EH_VALUE_BOOL, &b, 1); }
    static GgufValue string(std::string_view s);

    // An array of `count` numbers of `elem_type` (EH_VALUE_F32, ...), copied.
    static GgufValue numeric_array(uint32_t elem_type, const void* data, uint64_t count);
    static GgufValue array(std::span<const float> v) { return numeric_array(EH_VALUE_F32, v.data(), v.size()); }
    static GgufValue array(std::span<const int32_t> v) { return numeric_array(EH_VALUE_I32, v.data(), v.size()); }
    static GgufValue array(std::span<const uint32_t> v) { return numeric_array(EH_VALUE_U32, v.data(), v.size()); }
    static GgufValue array(std::span<const int64_t> v) { return numeric_array(EH_VALUE_I64, v.data(), v.size()); }
    static GgufValue array(std::span<const double> v) { return numeric_array(EH_VALUE_F64, v.data(), v.size()); }
    static GgufValue string_array(std::vector<std::string> v);
    // An array whose elements are arrays (each element must be an array).
    static GgufValue array_of_arrays(std::vector<GgufValue> v);

    uint32_t type() const { return type_; }
    uint32_t elem_type() const { return elem_type_; }
    uint64_t count() const { return count_; }
    // Encoded scalar / string bytes, or the elements of a numeric array.
    const std::vector<uint8_t>& bytes() const { return bytes_; }
    const std::vector<std::string>& strings() const { return strings_; }
    const std::vector<GgufValue>& nested() const { return nested_; }

private:
    static GgufValue scalar(uint32_t type, const void* p, size_t n);
    uint32_t type_ = EH_VALUE_U8;
    uint32_t elem_type_ = 0;
    uint64_t count_ = 1;
    std::vector<uint8_t> bytes_;           // scalars, string bytes, numeric array elements
    std::vector<std::string> strings_;     // string arrays
    std::vector<GgufValue> nested_;        // arrays of arrays
};

// Where write() puts bytes.
class ByteSink {
public:
    virtual ~ByteSink() = default;
    virtual void write(const void* data, size_t n) = 0;
};

class GgufWriter {
public:
    // `alignment` must be a power of two; when it is not 32 the writer adds
    // general.alignment itself (unless set() already did).
    explicit GgufWriter(uint32_t alignment = 32);

    // Metadata in insertion order. Throws eh::Error(InvalidRequest) on a duplicate key.
    void set(std::string key, GgufValue value);

    // dims in ggml order (dims[0] innermost). `data` is borrowed until write()
    // and must hold exactly the tensor's byte size.
    void add_tensor(std::string name, uint32_t type, std::vector<uint64_t> dims, const void* data);
    // Same, but the bytes come from `produce`, which must write exactly
    // tensor_nbytes(type, dims) bytes to the sink when write() runs.
    void add_tensor(std::string name, uint32_t type, std::vector<uint64_t> dims,
                    std::function<void(ByteSink&)> produce);

    // Streams the file to a partial file of its own beside `path` and renames
    // it into place (atomic: concurrent writers of one path never mix), so an
    // interrupted write leaves no complete-looking file. Throws
    // eh::Error(Internal) on I/O failure (and removes the partial file).
    void write(const std::string& path) const;
    void write(ByteSink& sink) const;
    std::vector<uint8_t> to_bytes() const;

    // Bytes of a tensor of `type` and `dims`; throws eh::Error(InvalidRequest)
    // for unknown types and dims that do not fit the type's blocks.
    static uint64_t tensor_nbytes(uint32_t type, std::span<const uint64_t> dims);

private:
    struct Tensor {
        std::string name;
        uint32_t type;
        std::vector<uint64_t> dims;
        uint64_t nbytes;
        uint64_t offset;
        std::function<void(ByteSink&)> produce;
    };
    uint32_t alignment_;
    std::vector<std::pair<std::string, GgufValue>> kv_;
    std::vector<Tensor> tensors_;
    uint64_t data_size_ = 0;
};

}  // namespace eh::model
