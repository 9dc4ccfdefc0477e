// Tiny safetensors files and HF directories written by the tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <string>
#include <vector>

namespace eh::model::testing {

struct StTensor {
    std::string name;
    std::string dtype;             // "BF16", "U8", ...
    std::vector<uint64_t> shape;   // PyTorch order
};

inline uint64_t dtype_size(const std::string& d) {
    if (d == "F64" || d == "I64") return 8;
    if (d == "F32" || d == "I32") return 4;
    if (d == "F16" || d == "BF16" || d == "I16") return 2;
    return 1;
}

// The JSON header for `tensors` laid out back to back; *data_bytes gets the total.
inline std::string st_header(const std::vector<StTensor>& tensors, uint64_t* data_bytes) {
    std::string h = "{\"__metadata__\":{\"format\":\"pt\"}";
    uint64_t off = 0;
    for (const auto& t : tensors) {
        uint64_t n = dtype_size(t.dtype);
        std::string shape;
        for (size_t i = 0; i < t.shape.size(); ++i) {
            n *= t.shape[i];
            shape += (i ? "," : "") + std::to_string(t.shape[i]);
        }
        h += ",\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[" + shape + "],\"data_offsets\":[" +
             std::to_string(off) + "," + std::to_string(off + n) + "]}";
        off += n;
    }
    *data_bytes = off;
    return h + "}";
}

// A file with an explicit header and `data_bytes` bytes of data (byte i = i % 251).
inline void write_st_raw(const std::filesystem::path& p, const std::string& header, uint64_t data_bytes) {
    std::ofstream out(p, std::ios::binary);
    uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    for (uint64_t i = 0; i < data_bytes; ++i) out.put(static_cast<char>(i % 251));
}

inline void write_st(const std::filesystem::path& p, const std::vector<StTensor>& tensors) {
    uint64_t bytes = 0;
    std::string h = st_header(tensors, &bytes);
    write_st_raw(p, h, bytes);
}

// A file holding real tensor bytes: data[i] is tensors[i]'s, its length the
// tensor's. The header is padded with spaces to a multiple of 8 bytes, as
// the format recommends, so the data starts aligned.
inline void write_st_data(const std::filesystem::path& p, const std::vector<StTensor>& tensors,
                          const std::vector<const void*>& data) {
    uint64_t bytes = 0;
    std::string h = st_header(tensors, &bytes);
    h.append((8 - h.size() % 8) % 8, ' ');
    std::ofstream out(p, std::ios::binary);
    const uint64_t n = h.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (size_t i = 0; i < tensors.size(); ++i) {
        uint64_t len = dtype_size(tensors[i].dtype);
        for (uint64_t d : tensors[i].shape) len *= d;
        out.write(static_cast<const char*>(data[i]), static_cast<std::streamsize>(len));
    }
}

inline void write_text(const std::filesystem::path& p, const std::string& text) {
    std::ofstream out(p, std::ios::binary);
    out << text;
}

// A fresh empty directory under the temp dir, removed by the destructor.
struct TempDir {
    std::filesystem::path path;
    explicit TempDir(const std::string& name) {
        path = std::filesystem::temp_directory_path() / ("eh_model_test_" + name + "_" + std::to_string(::getpid()));
        std::filesystem::remove_all(path);
        std::filesystem::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
};

}  // namespace eh::model::testing
