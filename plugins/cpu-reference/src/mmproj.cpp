#include "mmproj.hpp"

#include <engine_host/quant_blocks.hpp>

#include "thread_pool.hpp"

namespace cpuref::mmproj {

using ehp::Error;

Matrix mapped(const ehp::ModelView& v, const std::string& name, uint64_t cols, uint64_t rows) {
    const eh_tensor& t = ehp::mmproj::matrix(v, name, cols, rows);
    Matrix m;
    m.name = name;
    m.type = t.type;
    m.cols = cols;
    m.rows = rows;
    m.phys_rows = rows;
    m.row_bytes = ehp::quant::row_bytes(t.type, cols);
    if (m.row_bytes == 0 || t.nbytes < m.row_bytes * rows)
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
