// A minimal safetensors reader for the converter: the JSON header is parsed
// and validated against the file size; tensor bytes are read on demand, one
// tensor at a time.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace eh::tools {

struct SafeTensor {
    std::string file;
    std::string dtype;             // "F32", "F16", "BF16", "U8", ...
    std::vector<uint64_t> shape;   // row-major (PyTorch order)
    uint64_t offset = 0;           // absolute byte offset in the file
    uint64_t nbytes = 0;
};

// Every tensor of every *.safetensors file in `dir`, by name. Throws
// eh::Error(ModelLoadFailed) naming the file and field on malformed input.
std::map<std::string, SafeTensor> read_safetensors_dir(const std::string& dir);

// The tensor's values as floats (F32, F16, BF16 only).
std::vector<float> read_floats(const SafeTensor& t);
// Elements [first, first + count) of a float tensor, as floats.
std::vector<float> read_floats(const SafeTensor& t, uint64_t first, uint64_t count);

// The tensor's bytes as stored (any dtype; MXFP4 blocks and scales are U8).
std::vector<uint8_t> read_bytes(const SafeTensor& t);

// Writes a safetensors file of F32 tensors (for tests and tooling).
void write_safetensors_f32(const std::string& path,
                           const std::vector<std::pair<std::string, std::pair<std::vector<uint64_t>, std::vector<float>>>>& tensors);

}  // namespace eh::tools
