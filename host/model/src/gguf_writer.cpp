#include "eh/model/gguf_writer.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include <fmt/format.h>

#include <engine_host/tensor_types.h>

#include "eh/error.hpp"

namespace eh::model {

namespace {

size_t fixed_size(uint32_t type) {
    switch (type) {
    case EH_VALUE_U8: case EH_VALUE_I8: case EH_VALUE_BOOL: return 1;
    case EH_VALUE_U16: case EH_VALUE_I16: return 2;
    case EH_VALUE_U32: case EH_VALUE_I32: case EH_VALUE_F32: return 4;
    case EH_VALUE_U64: case EH_VALUE_I64: case EH_VALUE_F64: return 8;
    }
    return 0;
}

class Out {
public:
    explicit Out(ByteSink& s) : s_(s) {}
    void raw(const void* p, size_t n) { if (n) s_.write(p, n); pos_ += n; }
    void u32(uint32_t v) { raw(&v, 4); }
    void u64(uint64_t v) { raw(&v, 8); }
    void str(std::string_view s) { u64(s.size()); raw(s.data(), s.size()); }
    void pad_to(uint64_t align) {
        static const uint8_t zeros[256] = {};
        while (pos_ % align) {
            uint64_t n = align - pos_ % align;
            raw(zeros, n > sizeof zeros ? sizeof zeros : static_cast<size_t>(n));
        }
    }
    uint64_t pos() const { return pos_; }

private:
    ByteSink& s_;
    uint64_t pos_ = 0;
};

class FileSink : public ByteSink {
public:
    explicit FileSink(const std::string& path) : path_(path), f_(std::fopen(path.c_str(), "wb")) {
        if (!f_) throw Error(Code::Internal, fmt::format("cannot create '{}'", path));
    }
    ~FileSink() override { if (f_) std::fclose(f_); }
    void write(const void* data, size_t n) override {
        if (std::fwrite(data, 1, n, f_) != n) throw Error(Code::Internal, fmt::format("write to '{}' failed", path_));
    }
    void close() {
        int rc = std::fclose(f_);
        f_ = nullptr;
        if (rc != 0) throw Error(Code::Internal, fmt::format("closing '{}' failed", path_));
    }

private:
    std::string path_;
    std::FILE* f_;
};

class VectorSink : public ByteSink {
public:
    std::vector<uint8_t> bytes;
    void write(const void* data, size_t n) override {
        const uint8_t* p = static_cast<const uint8_t*>(data);
        bytes.insert(bytes.end(), p, p + n);
    }
};

// Counts bytes a tensor producer writes so a short or long write is caught.
class CountingSink : public ByteSink {
public:
    explicit CountingSink(Out& o) : o_(o) {}
    void write(const void* data, size_t n) override { o_.raw(data, n); written += n; }
    uint64_t written = 0;

private:
    Out& o_;
};

}  // namespace

GgufValue GgufValue::scalar(uint32_t type, const void* p, size_t n) {
    GgufValue v;
    v.type_ = type;
    v.bytes_.assign(static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
    return v;
}

GgufValue GgufValue::string(std::string_view s) {
    GgufValue v;
    v.type_ = EH_VALUE_STRING;
    v.bytes_.assign(s.begin(), s.end());
    return v;
}

GgufValue GgufValue::numeric_array(uint32_t elem_type, const void* data, uint64_t count) {
    size_t es = fixed_size(elem_type);
    if (es == 0) throw Error(Code::InvalidRequest, fmt::format("numeric_array: element type {} is not a number", elem_type));
    GgufValue v;
    v.type_ = EH_VALUE_ARRAY;
    v.elem_type_ = elem_type;
    v.count_ = count;
    const uint8_t* p = static_cast<const uint8_t*>(data);
    v.bytes_.assign(p, p + count * es);
    return v;
}

GgufValue GgufValue::string_array(std::vector<std::string> s) {
    GgufValue v;
    v.type_ = EH_VALUE_ARRAY;
    v.elem_type_ = EH_VALUE_STRING;
    v.count_ = s.size();
    v.strings_ = std::move(s);
    return v;
}

GgufValue GgufValue::array_of_arrays(std::vector<GgufValue> a) {
    for (const auto& e : a)
        if (e.type_ != EH_VALUE_ARRAY) throw Error(Code::InvalidRequest, "array_of_arrays: every element must be an array");
    GgufValue v;
    v.type_ = EH_VALUE_ARRAY;
    v.elem_type_ = EH_VALUE_ARRAY;
    v.count_ = a.size();
    v.nested_ = std::move(a);
    return v;
}

namespace {

void write_array(Out& o, const GgufValue& v) {
    o.u32(v.elem_type());
    o.u64(v.count());
    if (v.elem_type() == EH_VALUE_STRING) {
        for (const auto& s : v.strings()) o.str(s);
    } else if (v.elem_type() == EH_VALUE_ARRAY) {
        for (const auto& e : v.nested()) write_array(o, e);
    } else {
        o.raw(v.bytes().data(), v.bytes().size());
    }
}

void write_value(Out& o, const GgufValue& v) {
    if (v.type() == EH_VALUE_STRING)
        o.str(std::string_view(reinterpret_cast<const char*>(v.bytes().data()), v.bytes().size()));
    else if (v.type() == EH_VALUE_ARRAY)
        write_array(o, v);
    else
        o.raw(v.bytes().data(), v.bytes().size());
}

}  // namespace

GgufWriter::GgufWriter(uint32_t alignment) : alignment_(alignment) {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0)
        throw Error(Code::InvalidRequest, fmt::format("GGUF alignment {} is not a power of two", alignment));
}

void GgufWriter::set(std::string key, GgufValue value) {
    for (const auto& kv : kv_)
        if (kv.first == key) throw Error(Code::InvalidRequest, fmt::format("duplicate GGUF key '{}'", key));
    kv_.emplace_back(std::move(key), std::move(value));
}

uint64_t GgufWriter::tensor_nbytes(uint32_t type, std::span<const uint64_t> dims) {
    eh_type_traits tr = eh_tensor_type_traits(type);
    if (tr.block_bytes == 0) throw Error(Code::InvalidRequest, fmt::format("unknown tensor type {}", type));
    if (dims.empty() || dims.size() > EH_MAX_DIMS)
        throw Error(Code::InvalidRequest, fmt::format("tensor has {} dims (must be 1..{})", dims.size(), EH_MAX_DIMS));
    uint64_t n = 1;
    for (uint64_t d : dims)
        if (d == 0 || __builtin_mul_overflow(n, d, &n)) throw Error(Code::InvalidRequest, "tensor dims are zero or overflow");
    if (dims[0] % tr.block_elems)
        throw Error(Code::InvalidRequest,
                    fmt::format("dim 0 = {} is not a multiple of {}'s block size {}", dims[0], tr.name, tr.block_elems));
    return n / tr.block_elems * tr.block_bytes;
}

void GgufWriter::add_tensor(std::string name, uint32_t type, std::vector<uint64_t> dims, const void* data) {
    uint64_t n = tensor_nbytes(type, dims);
    add_tensor(std::move(name), type, std::move(dims), [data, n](ByteSink& s) { s.write(data, static_cast<size_t>(n)); });
}

void GgufWriter::add_tensor(std::string name, uint32_t type, std::vector<uint64_t> dims,
                            std::function<void(ByteSink&)> produce) {
    for (const auto& t : tensors_)
        if (t.name == name) throw Error(Code::InvalidRequest, fmt::format("duplicate tensor '{}'", name));
    uint64_t n = tensor_nbytes(type, dims);
    uint64_t off = (data_size_ + alignment_ - 1) / alignment_ * alignment_;
    tensors_.push_back(Tensor{std::move(name), type, std::move(dims), n, off, std::move(produce)});
    data_size_ = off + n;
}

void GgufWriter::write(ByteSink& sink) const {
    Out o(sink);
    bool add_alignment = alignment_ != 32;
    for (const auto& kv : kv_)
        if (kv.first == "general.alignment") add_alignment = false;
    o.raw("GGUF", 4);
    o.u32(3);
    o.u64(tensors_.size());
    o.u64(kv_.size() + (add_alignment ? 1 : 0));
    for (const auto& [key, v] : kv_) {
        o.str(key);
        o.u32(v.type());
        write_value(o, v);
    }
    if (add_alignment) {
        o.str("general.alignment");
        o.u32(EH_VALUE_U32);
        o.u32(alignment_);
    }
    for (const auto& t : tensors_) {
        o.str(t.name);
        o.u32(static_cast<uint32_t>(t.dims.size()));
        for (uint64_t d : t.dims) o.u64(d);
        o.u32(t.type);
        o.u64(t.offset);
    }
    o.pad_to(alignment_);
    uint64_t base = o.pos();
    for (const auto& t : tensors_) {
        o.pad_to(alignment_);
        if (o.pos() - base != t.offset) throw Error(Code::Internal, "GGUF writer lost track of tensor offsets");
        CountingSink c(o);
        t.produce(c);
        if (c.written != t.nbytes)
            throw Error(Code::Internal, fmt::format("tensor '{}' producer wrote {} bytes, expected {}", t.name,
                                                    c.written, t.nbytes));
    }
}

void GgufWriter::write(const std::string& path) const {
    // Write beside the target and rename, so an interrupted write never
    // leaves a file that looks complete. The partial name is this write's
    // own (process and call), so two writers of one path (two test
    // processes forging the same shared file) never truncate or rename each
    // other's bytes: each rename is atomic and the file is always one whole write.
    static std::atomic<uint64_t> writes{0};
    const std::string tmp = fmt::format("{}.partial.{}.{}", path, ::getpid(), writes.fetch_add(1));
    try {
        FileSink s(tmp);
        write(s);
        s.close();
        std::filesystem::rename(tmp, path);
    } catch (const std::filesystem::filesystem_error& e) {
        std::error_code ec;
        std::filesystem::remove(tmp, ec);
        throw Error(Code::Internal, fmt::format("cannot move '{}' into place: {}", tmp, e.what()));
    } catch (...) {
        std::error_code ec;
        std::filesystem::remove(tmp, ec);
        throw;
    }
}

std::vector<uint8_t> GgufWriter::to_bytes() const {
    VectorSink s;
    write(s);
    return std::move(s.bytes);
}

}  // namespace eh::model
