// GGUF v2/v3 reader. Layout (little-endian throughout):
//   "GGUF" u32 version  u64 n_tensors  u64 n_kv
//   n_kv   x { string key, u32 value_type, value }
//   n_tensors x { string name, u32 n_dims, u64 dims[n_dims], u32 type, u64 offset }
//   padding to general.alignment, then the data section (offsets are relative to it).
// A string is u64 length + bytes; an array is u32 elem_type + u64 count + elements
// (nested arrays repeat the array encoding without a type tag per element).
//
// Every length and count is checked against the bytes left in the file before
// it is used, so a hostile header can neither over-read nor make us allocate
// more than a small multiple of the file size.
#include <algorithm>
#include <bit>
#include <cstring>
#include <numeric>

#include <fmt/format.h>

#include <engine_host/tensor_types.h>

#include "eh/error.hpp"
#include "model_data.hpp"

namespace eh::model::detail {

namespace {

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a little-endian host");

constexpr uint64_t kDefaultAlignment = 32;
constexpr int kMaxArrayDepth = 8;

class Reader {
public:
    Reader(ModelData& m, const uint8_t* base, uint64_t size, const std::string& label)
        : m_(m), base_(base), size_(size), label_(label) {}

    void run();

private:
    [[noreturn]] void fail(uint64_t offset, const std::string& what) const {
        throw Error(Code::ModelLoadFailed,
                    fmt::format("GGUF '{}': {} (at offset {}, file size {})", label_, what, offset, size_));
    }

    uint64_t remaining() const { return size_ - pos_; }

    void need(uint64_t n, const std::string& field) const {
        if (n > remaining())
            fail(pos_, fmt::format("{} needs {} bytes but only {} remain (truncated file?)", field, n, remaining()));
    }

    template <class T>
    T read(const std::string& field) {
        need(sizeof(T), field);
        T v;
        std::memcpy(&v, base_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }

    std::string_view read_string(const std::string& field) {
        uint64_t at = pos_;
        uint64_t len = read<uint64_t>(field + " length");
        if (len > remaining())
            fail(at, fmt::format("{} length {} exceeds the {} bytes left in the file", field, len, remaining()));
        std::string_view s(reinterpret_cast<const char*>(base_ + pos_), static_cast<size_t>(len));
        pos_ += len;
        return s;
    }

    void read_header();
    void read_metadata();
    eh_value read_value(uint32_t type, const std::string& field, int depth);
    void read_array_body(eh_value& out, const std::string& field, int depth);
    void read_tensor_infos();
    void place_tensors();

    ModelData& m_;
    const uint8_t* base_;
    uint64_t size_;
    const std::string& label_;
    uint64_t pos_ = 0;
    uint64_t n_tensors_ = 0;
    uint64_t n_kv_ = 0;
    std::vector<uint64_t> offsets_;      // per tensor, relative to the data section
    std::vector<uint64_t> info_at_;      // where each tensor's info starts (for messages)
};

// Smallest encoding of one element of each value type: used to reject counts
// that could not possibly fit in the rest of the file.
uint64_t min_encoded_size(uint32_t type) {
    switch (type) {
    case EH_VALUE_U8: case EH_VALUE_I8: case EH_VALUE_BOOL: return 1;
    case EH_VALUE_U16: case EH_VALUE_I16: return 2;
    case EH_VALUE_U32: case EH_VALUE_I32: case EH_VALUE_F32: return 4;
    case EH_VALUE_U64: case EH_VALUE_I64: case EH_VALUE_F64: return 8;
    case EH_VALUE_STRING: return 8;
    case EH_VALUE_ARRAY: return 12;
    }
    return 0;  // unknown
}

bool is_fixed_size(uint32_t type) {
    return type != EH_VALUE_STRING && type != EH_VALUE_ARRAY && min_encoded_size(type) != 0;
}

void Reader::run() {
    m_.file_size = size_;
    read_header();
    read_metadata();
    read_tensor_infos();
    place_tensors();
}

void Reader::read_header() {
    if (size_ < 4) fail(0, "file is too short to hold the GGUF magic");
    if (std::memcmp(base_, "FUGG", 4) == 0)
        fail(0, "big-endian GGUF files are not supported (magic 'FUGG'); convert the file to little-endian");
    if (std::memcmp(base_, "GGUF", 4) != 0)
        fail(0, fmt::format("bad magic {:02x} {:02x} {:02x} {:02x}, expected 'GGUF'", base_[0], base_[1], base_[2],
                            base_[3]));
    pos_ = 4;
    uint32_t version = read<uint32_t>("version");
    uint32_t swapped = __builtin_bswap32(version);
    if (version == 1)
        fail(4, "unsupported GGUF version 1 (only versions 2 and 3 are supported; re-convert the model)");
    if (version != 2 && version != 3) {
        if (swapped >= 1 && swapped <= 3)
            fail(4, fmt::format("big-endian GGUF files are not supported (version field reads {} byte-swapped)",
                                swapped));
        fail(4, fmt::format("unsupported GGUF version {} (only versions 2 and 3 are supported)", version));
    }
    m_.gguf_version = version;
    n_tensors_ = read<uint64_t>("tensor count");
    n_kv_ = read<uint64_t>("metadata count");
}

void Reader::read_metadata() {
    // Each entry takes at least 8 (key length) + 4 (type) + 1 bytes.
    if (n_kv_ > remaining() / 13)
        fail(16, fmt::format("metadata count {} cannot fit in the {} bytes left", n_kv_, remaining()));
    m_.metadata.reserve(static_cast<size_t>(n_kv_));
    for (uint64_t i = 0; i < n_kv_; ++i) {
        uint64_t at = pos_;
        std::string_view key = read_string(fmt::format("metadata key #{}", i));
        std::string field = fmt::format("metadata '{}'", key);
        uint32_t type = read<uint32_t>(field + " type");
        eh_value v = read_value(type, field, 0);
        if (!m_.add_kv(key, v)) fail(at, fmt::format("duplicate metadata key '{}'", key));
    }

    m_.alignment = kDefaultAlignment;
    if (const auto* a = [&]() -> const eh_value* {
            auto it = m_.key_index.find("general.alignment");
            return it == m_.key_index.end() ? nullptr : &m_.metadata[it->second].value;
        }()) {
        bool unsigned_int = a->type == EH_VALUE_U8 || a->type == EH_VALUE_U16 || a->type == EH_VALUE_U32 ||
                            a->type == EH_VALUE_U64;
        if (!unsigned_int)
            fail(0, fmt::format("metadata 'general.alignment' is {}, expected u32", value_type_name(a->type)));
        if (a->v.u64 == 0 || (a->v.u64 & (a->v.u64 - 1)) != 0 || a->v.u64 > (uint64_t(1) << 30))
            fail(0, fmt::format("metadata 'general.alignment' = {} is not a power of two in [1, 2^30]", a->v.u64));
        m_.alignment = a->v.u64;
    }
    auto arch = m_.key_index.find("general.architecture");
    if (arch != m_.key_index.end() && m_.metadata[arch->second].value.type != EH_VALUE_STRING)
        fail(0, "metadata 'general.architecture' is not a string");
}

eh_value Reader::read_value(uint32_t type, const std::string& field, int depth) {
    eh_value v{};
    v.type = type;
    v.count = 1;
    uint64_t at = pos_;
    switch (type) {
    case EH_VALUE_U8: v.v.u64 = read<uint8_t>(field); break;
    case EH_VALUE_I8: v.v.i64 = read<int8_t>(field); break;
    case EH_VALUE_U16: v.v.u64 = read<uint16_t>(field); break;
    case EH_VALUE_I16: v.v.i64 = read<int16_t>(field); break;
    case EH_VALUE_U32: v.v.u64 = read<uint32_t>(field); break;
    case EH_VALUE_I32: v.v.i64 = read<int32_t>(field); break;
    case EH_VALUE_U64: v.v.u64 = read<uint64_t>(field); break;
    case EH_VALUE_I64: v.v.i64 = read<int64_t>(field); break;
    case EH_VALUE_F32: v.v.f64 = static_cast<double>(read<float>(field)); break;
    case EH_VALUE_F64: v.v.f64 = read<double>(field); break;
    case EH_VALUE_BOOL: {
        uint8_t b = read<uint8_t>(field);
        if (b > 1) fail(at, fmt::format("{} is a bool with byte value {}", field, b));
        v.v.u64 = b;
        break;
    }
    case EH_VALUE_STRING: v.v.str = m_.intern(read_string(field)); break;
    case EH_VALUE_ARRAY: read_array_body(v, field, depth); break;
    default: fail(at - 4, fmt::format("{} has unknown value type {}", field, type));
    }
    return v;
}

void Reader::read_array_body(eh_value& out, const std::string& field, int depth) {
    if (depth >= kMaxArrayDepth) fail(pos_, fmt::format("{} nests arrays deeper than {}", field, kMaxArrayDepth));
    uint64_t at = pos_;
    uint32_t elem = read<uint32_t>(field + " element type");
    uint64_t count = read<uint64_t>(field + " element count");
    uint64_t min = min_encoded_size(elem);
    if (min == 0) fail(at, fmt::format("{} has unknown element type {}", field, elem));
    if (count > remaining() / min)
        fail(at + 4, fmt::format("{} element count {} cannot fit in the {} bytes left", field, count, remaining()));
    out.type = EH_VALUE_ARRAY;
    out.elem_type = elem;
    out.count = count;
    out.v.array = nullptr;
    if (count == 0) return;

    if (is_fixed_size(elem)) {
        // Copy so the elements are naturally aligned (the mapping may not be).
        uint64_t bytes = count * min;
        void* dst = m_.arena.allocate(static_cast<size_t>(bytes), static_cast<size_t>(min));
        std::memcpy(dst, base_ + pos_, static_cast<size_t>(bytes));
        if (elem == EH_VALUE_BOOL) {
            const uint8_t* b = static_cast<const uint8_t*>(dst);
            for (uint64_t i = 0; i < count; ++i)
                if (b[i] > 1) fail(pos_ + i, fmt::format("{}[{}] is a bool with byte value {}", field, i, b[i]));
        }
        pos_ += bytes;
        out.v.array = dst;
    } else if (elem == EH_VALUE_STRING) {
        eh_string* dst = m_.arena.allocate_array<eh_string>(count);
        for (uint64_t i = 0; i < count; ++i) {
            uint64_t s_at = pos_;
            uint64_t len = read<uint64_t>(field + " string length");
            if (len > remaining())
                fail(s_at, fmt::format("{}[{}] string length {} exceeds the {} bytes left", field, i, len, remaining()));
            dst[i] = m_.intern(std::string_view(reinterpret_cast<const char*>(base_ + pos_), static_cast<size_t>(len)));
            pos_ += len;
        }
        out.v.array = dst;
    } else {  // nested arrays
        eh_value* dst = m_.arena.allocate_array<eh_value>(count);
        for (uint64_t i = 0; i < count; ++i) {
            dst[i] = eh_value{};
            read_array_body(dst[i], fmt::format("{}[{}]", field, i), depth + 1);
        }
        out.v.array = dst;
    }
}

void Reader::read_tensor_infos() {
    // Each info takes at least 8 (name) + 4 (n_dims) + 8 (one dim) + 4 (type) + 8 (offset).
    if (n_tensors_ > remaining() / 32)
        fail(8, fmt::format("tensor count {} cannot fit in the {} bytes left", n_tensors_, remaining()));
    m_.tensors.reserve(static_cast<size_t>(n_tensors_));
    offsets_.reserve(static_cast<size_t>(n_tensors_));
    for (uint64_t i = 0; i < n_tensors_; ++i) {
        uint64_t at = pos_;
        std::string_view name = read_string(fmt::format("tensor #{} name", i));
        std::string what = fmt::format("tensor '{}'", name);
        eh_tensor t{};
        t.name = m_.intern(name);
        uint64_t dims_at = pos_;
        t.n_dims = read<uint32_t>(what + " n_dims");
        if (t.n_dims == 0 || t.n_dims > EH_MAX_DIMS)
            fail(dims_at, fmt::format("{} has n_dims {} (must be 1..{})", what, t.n_dims, EH_MAX_DIMS));
        uint64_t elems = 1;
        for (uint32_t d = 0; d < EH_MAX_DIMS; ++d) t.dims[d] = 1;
        for (uint32_t d = 0; d < t.n_dims; ++d) {
            uint64_t dim_at = pos_;
            uint64_t n = read<uint64_t>(fmt::format("{} dim {}", what, d));
            if (n == 0) fail(dim_at, fmt::format("{} has dim {} = 0", what, d));
            if (n > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(elems, n, &elems) ||
                elems > static_cast<uint64_t>(INT64_MAX))
                fail(dim_at, fmt::format("{} has absurd dims (dim {} = {}, element count overflows)", what, d, n));
            t.dims[d] = n;
        }
        uint64_t type_at = pos_;
        t.type = read<uint32_t>(what + " type");
        eh_type_traits tr = eh_tensor_type_traits(t.type);
        if (tr.block_bytes == 0 || tr.block_elems == 0)
            fail(type_at, fmt::format("{} has unknown tensor type {}", what, t.type));
        if (t.dims[0] % tr.block_elems != 0)
            fail(dims_at, fmt::format("{} of type {} has dim 0 = {}, not a multiple of the block size {}", what,
                                      tr.name, t.dims[0], tr.block_elems));
        if (__builtin_mul_overflow(elems / tr.block_elems, uint64_t(tr.block_bytes), &t.nbytes))
            fail(dims_at, fmt::format("{} byte size overflows", what));
        uint64_t off_at = pos_;
        uint64_t offset = read<uint64_t>(what + " offset");
        if (offset % m_.alignment != 0)
            fail(off_at, fmt::format("{} data offset {} is not a multiple of the alignment {}", what, offset,
                                     m_.alignment));
        if (!m_.add_tensor(t)) fail(at, fmt::format("duplicate tensor name '{}'", name));
        offsets_.push_back(offset);
        info_at_.push_back(off_at);
    }
}

void Reader::place_tensors() {
    uint64_t a = m_.alignment;
    uint64_t data = pos_ % a == 0 ? pos_ : pos_ + (a - pos_ % a);  // pos_ <= size_ < 2^64 - 2^30
    m_.data_offset = data;
    if (m_.tensors.empty()) return;  // a vocab-only file may end before the padding
    if (data > size_)
        fail(pos_, fmt::format("data section starts at {}, past the end of the file", data));
    uint64_t room = size_ - data;
    for (size_t i = 0; i < m_.tensors.size(); ++i) {
        eh_tensor& t = m_.tensors[i];
        uint64_t off = offsets_[i];
        if (off > room || t.nbytes > room - off)
            fail(info_at_[i], fmt::format("tensor '{}' data [{}, +{}) runs past the end of the data section ({} bytes)",
                                          to_sv(t.name), off, t.nbytes, room));
        t.data = base_ + data + off;
    }
    std::vector<size_t> order(m_.tensors.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return offsets_[x] < offsets_[y]; });
    for (size_t k = 1; k < order.size(); ++k) {
        size_t prev = order[k - 1], cur = order[k];
        if (offsets_[cur] < offsets_[prev] + m_.tensors[prev].nbytes)
            fail(info_at_[cur], fmt::format("tensor '{}' data at {} overlaps tensor '{}' data [{}, +{})",
                                            to_sv(m_.tensors[cur].name), offsets_[cur],
                                            to_sv(m_.tensors[prev].name), offsets_[prev], m_.tensors[prev].nbytes));
    }
}

}  // namespace

void read_gguf(ModelData& m, std::shared_ptr<const MappedFile> file, const std::string& label) {
    Reader r(m, file->data(), file->size(), label);
    m.maps.push_back(std::move(file));
    r.run();
}

}  // namespace eh::model::detail
