// A read-only view of a whole file's bytes: an mmap of a file on disk, or an
// owned heap copy of a caller's buffer (tests and the fuzzer use that; a heap
// copy of exact size lets AddressSanitizer catch any over-read).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace eh::model::detail {

class MappedFile {
public:
    // Throws eh::Error(ModelLoadFailed) naming the path and the OS error.
    static std::shared_ptr<const MappedFile> open(const std::string& path);
    static std::shared_ptr<const MappedFile> from_buffer(const void* data, size_t size);

    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const uint8_t* data() const { return data_; }
    uint64_t size() const { return size_; }

private:
    MappedFile() = default;
    const uint8_t* data_ = nullptr;
    uint64_t size_ = 0;
    void* map_ = nullptr;  // non-null when mmap'ed
    std::unique_ptr<uint8_t[]> owned_;
};

}  // namespace eh::model::detail
