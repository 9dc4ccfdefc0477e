// Shared by the forge, the quantizer and the converter: produce a tensor's
// rows as floats, quantize them to the output type on every core, and
// stream the bytes to the writer in row order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <engine_host/quant_blocks.hpp>

#include "eh/error.hpp"
#include "eh/model/gguf_writer.hpp"
#include "eh/tools/parallel.hpp"

namespace eh::tools::detail {

// fill(first_row, n_rows, out) writes n_rows * ne0 floats.
using RowFill = std::function<void(uint64_t first_row, uint64_t n_rows, float* out)>;

inline void stream_rows(const std::string& name, uint32_t out_type, uint64_t ne0, uint64_t rows,
                        WorkerPool& pool, model::ByteSink& sink, const RowFill& fill) {
    const uint64_t rb = ehp::quant::row_bytes(out_type, ne0);
    if (rb == 0)
        throw Error(Code::InvalidRequest,
                    fmt::format("tensor '{}': a row of {} values does not split into blocks of type {}", name, ne0, out_type));
    const uint64_t rows_per_task = std::max<uint64_t>(1, (uint64_t(1) << 18) / ne0);
    const uint64_t rows_per_batch = rows_per_task * uint64_t(pool.size()) * 4;
    std::vector<uint8_t> buf(std::min(rows, rows_per_batch) * rb);
    for (uint64_t r0 = 0; r0 < rows; r0 += rows_per_batch) {
        const uint64_t batch_rows = std::min(rows_per_batch, rows - r0);
        const uint64_t n_tasks = (batch_rows + rows_per_task - 1) / rows_per_task;
        pool.run(n_tasks, [&](size_t task) {
            thread_local std::vector<float> scratch;
            const uint64_t first = task * rows_per_task;
            const uint64_t n = std::min(rows_per_task, batch_rows - first);
            scratch.resize(n * ne0);
            fill(r0 + first, n, scratch.data());
            for (uint64_t r = 0; r < n; ++r)
                ehp::quant::quantize_row(out_type, scratch.data() + r * ne0, buf.data() + (first + r) * rb, ne0);
        });
        sink.write(buf.data(), batch_rows * rb);
    }
}

}  // namespace eh::tools::detail
