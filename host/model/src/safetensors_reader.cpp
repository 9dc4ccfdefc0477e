// safetensors: u64 (LE) header length N, N bytes of JSON
//   { "name": {"dtype": "BF16", "shape": [out, in], "data_offsets": [begin, end]}, ...,
//     "__metadata__": {string: string} }
// then the data section; offsets are relative to its start (byte 8 + N).
#include <algorithm>
#include <cstring>
#include <numeric>

#include <fmt/format.h>
#include <simdjson.h>

#include <engine_host/tensor_types.h>

#include "eh/error.hpp"
#include "hf.hpp"

namespace eh::model::detail {

namespace {

constexpr uint64_t kMaxHeader = uint64_t(100) << 20;  // the format's own reference limit

bool dtype_to_type(std::string_view d, uint32_t& type) {
    struct Map { const char* name; uint32_t type; };
    static const Map kMap[] = {
        {"F32", EH_TYPE_F32}, {"F16", EH_TYPE_F16}, {"BF16", EH_TYPE_BF16}, {"F64", EH_TYPE_F64},
        {"I8", EH_TYPE_I8},   {"I16", EH_TYPE_I16}, {"I32", EH_TYPE_I32},   {"I64", EH_TYPE_I64},
        {"U8", EH_TYPE_U8},
    };
    for (const auto& e : kMap)
        if (d == e.name) { type = e.type; return true; }
    return false;
}

[[noreturn]] void st_fail(const std::string& label, uint64_t size, uint64_t offset, const std::string& what) {
    throw Error(Code::ModelLoadFailed,
                fmt::format("safetensors '{}': {} (at offset {}, file size {})", label, what, offset, size));
}

}  // namespace

void read_safetensors(ModelData& m, std::shared_ptr<const MappedFile> file, const std::string& label,
                      const std::function<std::string(std::string_view)>& rename) {
    const uint8_t* base = file->data();
    const uint64_t size = file->size();
    struct {
        const std::string& label;
        uint64_t size;
        [[noreturn]] void operator()(uint64_t offset, const std::string& what) const { st_fail(label, size, offset, what); }
    } fail{label, size};
    if (size < 8) fail(0, "file is too short to hold the header length");
    uint64_t n;
    std::memcpy(&n, base, 8);
    if (n < 2 || n > size - 8 || n > kMaxHeader)
        fail(0, fmt::format("header length {} is invalid (file has {} bytes after the length field)", n, size - 8));
    const uint64_t data_start = 8 + n;
    const uint64_t data_size = size - data_start;

    simdjson::padded_string json(reinterpret_cast<const char*>(base + 8), static_cast<size_t>(n));
    simdjson::dom::parser parser;
    simdjson::dom::element root;
    if (auto err = parser.parse(json).get(root))
        fail(8, fmt::format("header is not valid JSON: {}", simdjson::error_message(err)));
    simdjson::dom::object obj;
    if (root.get(obj)) fail(8, "header is not a JSON object");

    struct Placed { size_t index; uint64_t begin, end; };
    std::vector<Placed> placed;
    for (auto field : obj) {
        std::string_view name = field.key;
        if (name == "__metadata__") continue;
        std::string what = fmt::format("tensor '{}'", name);
        simdjson::dom::object t;
        if (field.value.get(t)) fail(8, what + " is not an object");
        std::string_view dtype;
        if (t["dtype"].get(dtype)) fail(8, what + " has no string 'dtype'");
        eh_tensor out{};
        if (!dtype_to_type(dtype, out.type))
            fail(8, fmt::format("{} has unsupported dtype '{}' (supported: F32 F16 BF16 F64 I8 I16 I32 I64 U8)",
                                what, dtype));
        simdjson::dom::array shape;
        if (t["shape"].get(shape)) fail(8, what + " has no 'shape' array");
        size_t rank = shape.size();
        if (rank > EH_MAX_DIMS) fail(8, fmt::format("{} has rank {} (at most {} supported)", what, rank, EH_MAX_DIMS));
        std::vector<uint64_t> dims;
        for (auto d : shape) {
            uint64_t v;
            if (d.get(v)) fail(8, what + " has a shape entry that is not a non-negative integer");
            dims.push_back(v);
        }
        // PyTorch order [outer .. inner] -> ggml order {inner .. outer}.
        out.n_dims = rank == 0 ? 1 : static_cast<uint32_t>(rank);
        for (uint32_t i = 0; i < EH_MAX_DIMS; ++i) out.dims[i] = 1;
        for (size_t i = 0; i < rank; ++i) out.dims[i] = dims[rank - 1 - i];
        uint64_t elems = 1;
        for (size_t i = 0; i < rank; ++i) {
            if (dims[i] == 0) fail(8, fmt::format("{} has a zero dimension in shape", what));
            if (__builtin_mul_overflow(elems, dims[i], &elems)) fail(8, what + " shape overflows");
        }
        eh_type_traits tr = eh_tensor_type_traits(out.type);
        if (__builtin_mul_overflow(elems, uint64_t(tr.block_bytes), &out.nbytes)) fail(8, what + " byte size overflows");
        simdjson::dom::array offs;
        if (t["data_offsets"].get(offs) || offs.size() != 2) fail(8, what + " has no 'data_offsets' [begin, end]");
        uint64_t begin, end;
        if (offs.at(0).get(begin) || offs.at(1).get(end)) fail(8, what + " data_offsets are not non-negative integers");
        if (begin > end || end > data_size)
            fail(data_start, fmt::format("{} data_offsets [{}, {}) lie outside the {}-byte data section", what, begin,
                                         end, data_size));
        if (end - begin != out.nbytes)
            fail(data_start + begin, fmt::format("{} spans {} bytes but dtype {} and its shape need {}", what,
                                                 end - begin, dtype, out.nbytes));
        out.data = base + data_start + begin;
        std::string gguf_name = rename(name);
        out.name = m.intern(gguf_name);
        if (!m.add_tensor(out))
            fail(8, fmt::format("{} (as '{}') appears twice in the model", what, gguf_name));
        placed.push_back({m.tensors.size() - 1, begin, end});
    }
    std::sort(placed.begin(), placed.end(), [](const Placed& a, const Placed& b) { return a.begin < b.begin; });
    for (size_t k = 1; k < placed.size(); ++k)
        if (placed[k].begin < placed[k - 1].end)
            fail(data_start + placed[k].begin,
                 fmt::format("tensor '{}' data overlaps tensor '{}'", to_sv(m.tensors[placed[k].index].name),
                             to_sv(m.tensors[placed[k - 1].index].name)));
    m.maps.push_back(std::move(file));
}

}  // namespace eh::model::detail
