// A bump allocator for everything a ModelFile view points at (keys, strings,
// arrays, tensor names). Blocks never move, so raw pointers handed out in the
// eh_model_view stay valid for the ModelFile's lifetime, and a 200k-entry
// vocabulary costs a few large allocations instead of 200k small ones.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>

namespace eh::model::detail {

class Arena {
public:
    // `align` must be a power of two no larger than alignof(std::max_align_t).
    void* allocate(size_t bytes, size_t align) {
        size_t pos = (used_ + align - 1) & ~(align - 1);
        if (blocks_.empty() || pos > capacity_ || bytes > capacity_ - pos) {
            size_t cap = bytes > kBlock / 4 ? bytes : kBlock;
            if (bytes > kBlock / 4) {
                // Large requests get a block of their own so the current one keeps filling.
                large_.push_back(std::unique_ptr<std::max_align_t[]>(
                    new std::max_align_t[(cap + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t) + 1]));
                return large_.back().get();
            }
            blocks_.push_back(std::unique_ptr<std::max_align_t[]>(
                new std::max_align_t[cap / sizeof(std::max_align_t) + 1]));
            capacity_ = cap;
            used_ = 0;
            pos = 0;
        }
        used_ = pos + bytes;
        return reinterpret_cast<char*>(blocks_.back().get()) + pos;
    }

    // A NUL-terminated copy of `s`.
    const char* copy_string(std::string_view s) {
        char* p = static_cast<char*>(allocate(s.size() + 1, 1));
        if (!s.empty()) std::memcpy(p, s.data(), s.size());
        p[s.size()] = '\0';
        return p;
    }

    template <class T>
    T* allocate_array(uint64_t count) {
        if (count == 0) return nullptr;
        return static_cast<T*>(allocate(static_cast<size_t>(count) * sizeof(T), alignof(T)));
    }

private:
    static constexpr size_t kBlock = size_t(1) << 20;
    std::vector<std::unique_ptr<std::max_align_t[]>> blocks_;
    std::vector<std::unique_ptr<std::max_align_t[]>> large_;
    size_t capacity_ = 0;
    size_t used_ = 0;
};

}  // namespace eh::model::detail
