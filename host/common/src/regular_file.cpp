#include "eh/regular_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace eh {

std::optional<std::string> read_regular_file(const std::string& path, size_t max_bytes, std::string& problem) {
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
    int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        problem = "cannot read " + path + ": " + std::strerror(errno);
        return std::nullopt;
    }
    struct Closer {
        int fd;
        ~Closer() { ::close(fd); }
    } closer{fd};
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        problem = "cannot read " + path + ": " + std::strerror(errno);
        return std::nullopt;
    }
    if (!S_ISREG(st.st_mode)) {
        problem = path + " is not a regular file";
        return std::nullopt;
    }
    const auto too_large = [&] {
        problem = path + " is larger than the limit of " + std::to_string(max_bytes) + " bytes";
        return std::nullopt;
    };
    if (uint64_t(st.st_size) > max_bytes) return too_large();
    std::string out;
    out.resize(max_bytes + 1);
    size_t got = 0;
    while (got < out.size()) {
        ssize_t n = ::read(fd, out.data() + got, out.size() - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            problem = "cannot read " + path + ": " + std::strerror(errno);
            return std::nullopt;
        }
        if (n == 0) break;
        got += size_t(n);
    }
    if (got > max_bytes) return too_large();  // grew since fstat
    out.resize(got);
    return out;
}

}  // namespace eh
