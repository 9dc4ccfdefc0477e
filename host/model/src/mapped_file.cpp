#include "mapped_file.hpp"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "eh/error.hpp"

namespace eh::model::detail {

namespace {

struct Fd {
    int fd = -1;
    ~Fd() { if (fd >= 0) ::close(fd); }
};

[[noreturn]] void os_fail(const std::string& path, const char* what) {
    throw Error(Code::ModelLoadFailed, fmt::format("cannot {} '{}': {}", what, path, std::strerror(errno)));
}

}  // namespace

std::shared_ptr<const MappedFile> MappedFile::open(const std::string& path) {
    Fd f;
    // O_NONBLOCK: a FIFO would otherwise block open() until a writer comes;
    // it is refused below as not a regular file. Regular files ignore it.
    f.fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (f.fd < 0) os_fail(path, "open");
    struct stat st {};
    if (::fstat(f.fd, &st) != 0) os_fail(path, "stat");
    if (!S_ISREG(st.st_mode))
        throw Error(Code::ModelLoadFailed, fmt::format("'{}' is not a regular file", path));
    std::shared_ptr<MappedFile> m(new MappedFile());
    m->size_ = static_cast<uint64_t>(st.st_size);
    if (m->size_ == 0) return m;  // mmap refuses length 0; an empty file has no bytes to view
    void* p = ::mmap(nullptr, static_cast<size_t>(m->size_), PROT_READ, MAP_PRIVATE, f.fd, 0);
    if (p == MAP_FAILED) os_fail(path, "mmap");
    m->map_ = p;
    m->data_ = static_cast<const uint8_t*>(p);
    return m;
}

std::shared_ptr<const MappedFile> MappedFile::from_buffer(const void* data, size_t size) {
    std::shared_ptr<MappedFile> m(new MappedFile());
    m->size_ = size;
    if (size > 0) {
        m->owned_.reset(new uint8_t[size]);
        std::memcpy(m->owned_.get(), data, size);
        m->data_ = m->owned_.get();
    }
    return m;
}

MappedFile::~MappedFile() {
    if (map_) ::munmap(map_, static_cast<size_t>(size_));
}

}  // namespace eh::model::detail
