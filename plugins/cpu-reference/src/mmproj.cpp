#include "mmproj.hpp"

#include <engine_host/quant_blocks.hpp>

#include "thread_pool.hpp"

namespace cpuref::mmproj {

using ehp::Error;

namespace {

uint64_t elements(const eh_tensor& t) {
    uint64_t n = 1;
    for (uint32_t d = 0; d < t.n_dims && d < EH_MAX_DIMS; ++d)
        if (__builtin_mul_overflow(n, t.dims[d], &n)) return UINT64_MAX;
    return n;
}

}  // namespace

std::string vblk(uint32_t i, const char* what) { return "v.blk." + std::to_string(i) + "." + what; }

std::vector<float> floats(const ehp::ModelView& v, const std::string& name, uint64_t n) {
    const eh_tensor& t = v.require_tensor(name);
    if (elements(t) != n)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj tensor '" + name + "' has " + std::to_string(elements(t)) +
                                              " elements, expected " + std::to_string(n));
    const uint64_t bytes = ehp::quant::row_bytes(t.type, n);
    if (bytes == 0 || t.nbytes < bytes || !t.data)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj tensor '" + name + "' of type " + ehp::type_name(t.type) +
                                              " is too short or not a whole number of blocks");
    std::vector<float> out(n);
    if (!ehp::quant::dequantize_row(t.type, t.data, out.data(), n))
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj tensor '" + name + "': type " + ehp::type_name(t.type) +
                                              " cannot be read");
    return out;
}

Matrix mapped(const ehp::ModelView& v, const std::string& name, uint64_t cols, uint64_t rows) {
    const eh_tensor& t = v.require_tensor(name);
    if (t.n_dims < 2 || t.dims[0] != cols || t.dims[1] != rows || elements(t) != cols * rows)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj tensor '" + name + "' must have dims {" + std::to_string(cols) + ", " +
                                              std::to_string(rows) + "}");
    Matrix m;
    m.name = name;
    m.type = t.type;
    m.cols = cols;
    m.rows = rows;
    m.phys_rows = rows;
    m.row_bytes = ehp::quant::row_bytes(t.type, cols);
    if (m.row_bytes == 0 || t.nbytes < m.row_bytes * rows || !t.data)
        throw Error(EH_MODEL_LOAD_FAILED, "mmproj tensor '" + name + "' of type " + ehp::type_name(t.type) +
                                              " is too short or not a whole number of blocks");
    m.data = static_cast<const uint8_t*>(t.data);
    return m;
}

Matrix owned(const std::string& name, const std::vector<float>& v, uint64_t cols, uint64_t rows) {
    Matrix m;
    m.name = name;
    m.type = EH_TYPE_F32;
    m.cols = cols;
    m.rows = rows;
    m.phys_rows = rows;
    m.row_bytes = cols * sizeof(float);
    m.data = reinterpret_cast<const uint8_t*>(v.data());
    return m;
}

uint32_t key_u32(const ehp::ModelView& v, const char* key) {
    const uint64_t x = v.require_uint(key);
    if (x == 0 || x > (1u << 20))
        throw Error(EH_MODEL_LOAD_FAILED, std::string("mmproj metadata '") + key + "' is " + std::to_string(x) +
                                              ", outside 1.." + std::to_string(1u << 20));
    return uint32_t(x);
}

void three_floats(const ehp::ModelView& v, const char* key, float (&out)[3]) {
    const eh_value* x = v.find(key);
    if (!x) throw Error(EH_MODEL_LOAD_FAILED, std::string("missing mmproj metadata '") + key + "'");
    if (x->type != EH_VALUE_ARRAY || x->count != 3 || (x->elem_type != EH_VALUE_F32 && x->elem_type != EH_VALUE_F64))
        throw Error(EH_MODEL_LOAD_FAILED, std::string("mmproj metadata '") + key + "' must be an array of 3 floats");
    for (int c = 0; c < 3; ++c)
        out[c] = x->elem_type == EH_VALUE_F32 ? static_cast<const float*>(x->v.array)[c]
                                               : float(static_cast<const double*>(x->v.array)[c]);
}

std::string projector_type(const ehp::ModelView& v) {
    if (auto p = v.get_string("clip.projector_type")) return std::string(*p);
    if (auto q = v.get_string("clip.vision.projector_type")) return std::string(*q);
    throw Error(EH_MODEL_LOAD_FAILED, "the mmproj file has no 'clip.projector_type': not a multimodal projector");
}

Linear linear(const ehp::ModelView& v, uint32_t block, const std::string& what, uint64_t cols, uint64_t rows) {
    return {mapped(v, vblk(block, (what + ".weight").c_str()), cols, rows),
            floats(v, vblk(block, (what + ".bias").c_str()), rows)};
}

void apply(ThreadPool& pool, const Linear& l, const float* x, size_t n, float* y) {
    matmul(pool, l.w, 0, l.w.rows, x, n, l.w.cols, y, l.w.rows, l.b.data());
}

Attention attention(const ehp::ModelView& v, uint32_t block, uint64_t width) {
    return {linear(v, block, "attn_q", width, width), linear(v, block, "attn_k", width, width),
            linear(v, block, "attn_v", width, width), linear(v, block, "attn_out", width, width)};
}

}  // namespace cpuref::mmproj
