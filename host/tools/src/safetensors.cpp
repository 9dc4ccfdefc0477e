#include "eh/tools/safetensors.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <engine_host/quant_blocks.hpp>

#include "eh/error.hpp"

namespace eh::tools {

namespace fs = std::filesystem;

namespace {

uint64_t dtype_size(const std::string& d) {
    if (d == "F32" || d == "I32" || d == "U32") return 4;
    if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
    if (d == "U8" || d == "I8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
    if (d == "F64" || d == "I64" || d == "U64") return 8;
    return 0;
}

void read_one(const fs::path& p, std::map<std::string, SafeTensor>& out) {
    const std::string file = p.string();
    std::ifstream in(p, std::ios::binary);
    if (!in) throw Error(Code::ModelLoadFailed, fmt::format("cannot read '{}'", file));
    const uint64_t size = fs::file_size(p);
    uint64_t hlen = 0;
    if (size < 8 || !in.read(reinterpret_cast<char*>(&hlen), 8))
        throw Error(Code::ModelLoadFailed, fmt::format("'{}': too short for a safetensors header", file));
    if (hlen > size - 8 || hlen > (uint64_t(100) << 20))
        throw Error(Code::ModelLoadFailed, fmt::format("'{}': header length {} exceeds the file", file, hlen));
    std::string header(hlen, '\0');
    in.read(header.data(), static_cast<std::streamsize>(hlen));
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(header);
    } catch (const nlohmann::json::exception& e) {
        throw Error(Code::ModelLoadFailed, fmt::format("'{}': header is not JSON: {}", file, e.what()));
    }
    const uint64_t base = 8 + hlen;
    for (auto it = j.begin(); it != j.end(); ++it) {
        if (it.key() == "__metadata__") continue;
        const auto& v = it.value();
        SafeTensor t;
        t.file = file;
        try {
            t.dtype = v.at("dtype").get<std::string>();
            t.shape = v.at("shape").get<std::vector<uint64_t>>();
            const auto offs = v.at("data_offsets").get<std::vector<uint64_t>>();
            if (offs.size() != 2 || offs[0] > offs[1]) throw Error(Code::ModelLoadFailed, "bad data_offsets");
            t.offset = base + offs[0];
            t.nbytes = offs[1] - offs[0];
        } catch (const nlohmann::json::exception& e) {
            throw Error(Code::ModelLoadFailed, fmt::format("'{}': tensor '{}': {}", file, it.key(), e.what()));
        }
        uint64_t n = 1;
        for (uint64_t d : t.shape) n *= d;
        const uint64_t es = dtype_size(t.dtype);
        if (es == 0 || n * es != t.nbytes || t.offset + t.nbytes > size)
            throw Error(Code::ModelLoadFailed, fmt::format("'{}': tensor '{}' ({} {} elements) does not match its byte range",
                                                           file, it.key(), t.dtype, n));
        out[it.key()] = std::move(t);
    }
}

}  // namespace

std::map<std::string, SafeTensor> read_safetensors_dir(const std::string& dir) {
    std::map<std::string, SafeTensor> out;
    std::vector<fs::path> files;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
        if (e.path().extension() == ".safetensors") files.push_back(e.path());
    if (ec) throw Error(Code::NotFound, fmt::format("cannot read directory '{}'", dir));
    std::sort(files.begin(), files.end());
    if (files.empty()) throw Error(Code::ModelLoadFailed, fmt::format("'{}' holds no .safetensors files", dir));
    for (const auto& f : files) read_one(f, out);
    return out;
}

std::vector<uint8_t> read_bytes(const SafeTensor& t) {
    std::ifstream in(t.file, std::ios::binary);
    std::vector<uint8_t> raw(t.nbytes);
    in.seekg(static_cast<std::streamoff>(t.offset));
    if (!in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(t.nbytes)))
        throw Error(Code::ModelLoadFailed, fmt::format("'{}': short read at offset {}", t.file, t.offset));
    return raw;
}

std::vector<float> read_floats(const SafeTensor& t) {
    return read_floats(t, 0, t.nbytes / (t.dtype == "F32" ? 4 : 2));
}

std::vector<float> read_floats(const SafeTensor& t, uint64_t first, uint64_t count) {
    if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16")
        throw Error(Code::InvalidRequest, fmt::format("'{}': dtype {} is not a float type", t.file, t.dtype));
    const uint64_t es = t.dtype == "F32" ? 4 : 2;
    if (first > t.nbytes / es || count > t.nbytes / es - first)
        throw Error(Code::Internal, fmt::format("'{}': elements {} + {} past the tensor's {}", t.file, first, count, t.nbytes / es));
    SafeTensor part = t;
    part.offset += first * es;
    part.nbytes = count * es;
    const std::vector<uint8_t> raw = read_bytes(part);
    const uint64_t n = count;
    std::vector<float> out(n);
    if (t.dtype == "F32") {
        std::memcpy(out.data(), raw.data(), part.nbytes);
    } else {
        for (uint64_t i = 0; i < n; ++i) {
            uint16_t h;
            std::memcpy(&h, raw.data() + 2 * i, 2);
            out[i] = t.dtype == "F16" ? ehp::quant::fp16_to_fp32(h) : ehp::quant::bf16_to_fp32(h);
        }
    }
    return out;
}

void write_safetensors_f32(const std::string& path,
                           const std::vector<std::pair<std::string, std::pair<std::vector<uint64_t>, std::vector<float>>>>& tensors) {
    nlohmann::json h = nlohmann::json::object();
    uint64_t off = 0;
    for (const auto& [name, t] : tensors) {
        const uint64_t nb = t.second.size() * 4;
        h[name] = {{"dtype", "F32"}, {"shape", t.first}, {"data_offsets", {off, off + nb}}};
        off += nb;
    }
    std::string hs = h.dump();
    while (hs.size() % 8) hs += ' ';
    std::ofstream out(path, std::ios::binary);
    const uint64_t hl = hs.size();
    out.write(reinterpret_cast<const char*>(&hl), 8);
    out.write(hs.data(), static_cast<std::streamsize>(hs.size()));
    for (const auto& [name, t] : tensors)
        out.write(reinterpret_cast<const char*>(t.second.data()), static_cast<std::streamsize>(t.second.size() * 4));
    if (!out) throw Error(Code::Internal, fmt::format("writing '{}' failed", path));
}

}  // namespace eh::tools
