#include "ehcuda/weight_plan.hpp"

#include <string>

#include <engine_host/plugin_abi.hpp>

#include "ehcuda/mxfp4_layout.hpp"

namespace ehcuda {

size_t WeightPlan::add(const void* src, size_t bytes, size_t reserve_bytes, std::string name, uint32_t type) {
    const size_t off = arena_.reserve(reserve_bytes);
    items_.push_back({src, off, bytes, std::move(name), 0});
    type_bytes_[type] += bytes;
    return off;
}

size_t WeightPlan::add_mxfp4(const void* src, int64_t rows, int64_t cols, size_t pad_bytes, std::string name) {
    const size_t src_row = mxfp4_file_row_bytes(cols), dst_row = mxfp4_device_row_bytes(cols);
    if (src_row == 0 || rows <= 0 || cols > INT32_MAX)
        throw ehp::Error(EH_INTERNAL, "weight plan: MXFP4 tensor '" + name + "' with " + std::to_string(rows) +
                                          " rows of " + std::to_string(cols));
    const size_t bytes = src_row * size_t(rows);
    const size_t off = arena_.reserve(dst_row * size_t(rows) + pad_bytes);
    items_.push_back({src, off, bytes, std::move(name), int(cols)});
    type_bytes_[EH_TYPE_MXFP4] += bytes;
    return off;
}

size_t WeightPlan::host_floats(std::vector<float> v, std::string name, const void** slot) {
    const size_t off = arena_.reserve(v.size() * 4);
    converted_.push_back(std::move(v));
    items_.push_back({converted_.back().data(), off, converted_.back().size() * 4, std::move(name), 0});
    if (slot) fixups_.push_back({slot, off});
    return off;
}

void WeightPlan::finish_layout(std::vector<std::pair<const void*, std::string>>& weight_ptrs) {
    for (auto& f : fixups_) *f.slot = arena_.at(f.offset);
    for (auto& it : items_) weight_ptrs.push_back({arena_.at(it.offset), it.name});
}

std::vector<UploadItem> WeightPlan::upload_items() const {
    std::vector<UploadItem> v;
    for (auto& it : items_) v.push_back({it.src, arena_.at(it.offset), it.bytes, it.mxfp4_cols});
    return v;
}

std::string WeightPlan::dominant_type() const {
    uint32_t best = EH_TYPE_F32;
    size_t bytes = 0;
    for (auto& [t, b] : type_bytes_)
        if (b > bytes) { best = t; bytes = b; }
    return ehp::type_name(best);
}

}  // namespace ehcuda
