// The bookkeeping a plugin's loader shares: which host bytes go to which
// arena offset, which pointers to patch once the arena exists, host-side
// converted copies kept alive until the upload, and bytes per stored type.
// The plugin does its own per-tensor checks and calls add() / host_floats().
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ehcuda/device_memory.hpp>
#include <ehcuda/upload.hpp>

namespace ehcuda {

class WeightPlan {
public:
    explicit WeightPlan(DeviceArena& arena) : arena_(arena) {}

    // Plans `bytes` from src at a new arena piece of `reserve_bytes` (>=
    // bytes: room for padding) and counts them for `type`. Returns the offset.
    size_t add(const void* src, size_t bytes, size_t reserve_bytes, std::string name, uint32_t type);
    // Plans `rows` ggml MXFP4 rows of `cols` values from src (the caller has
    // checked the file holds rows * mxfp4_file_row_bytes(cols) bytes), to be
    // rewritten at upload into the device layout at a new arena piece of
    // rows * mxfp4_device_row_bytes(cols) + pad_bytes. Counts the file bytes
    // as MXFP4. Returns the offset.
    size_t add_mxfp4(const void* src, int64_t rows, int64_t cols, size_t pad_bytes, std::string name);
    // Host floats (converted on the host), kept until the upload is done.
    // slot (optional) gets the device address after finish_layout().
    size_t host_floats(std::vector<float> v, std::string name, const void** slot);
    // *slot = the device address of `offset`, after finish_layout().
    void fix(const void** slot, size_t offset) { fixups_.push_back({slot, offset}); }

    // After the arena is allocated: patches every slot and lists each piece's
    // device address and name (for the residency check).
    void finish_layout(std::vector<std::pair<const void*, std::string>>& weight_ptrs);
    std::vector<UploadItem> upload_items() const;
    // The stored type holding the most bytes, by name.
    std::string dominant_type() const;

private:
    struct Item {
        const void* src;
        size_t offset;
        size_t bytes;
        std::string name;
        int mxfp4_cols = 0;
    };
    struct Fixup {
        const void** slot;
        size_t offset;
    };
    DeviceArena& arena_;
    std::vector<Item> items_;
    std::vector<Fixup> fixups_;
    std::vector<std::vector<float>> converted_;
    std::map<uint32_t, size_t> type_bytes_;
};

}  // namespace ehcuda
