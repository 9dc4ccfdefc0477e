// The model forge: writes a GGUF v3 file with a real model's metadata keys,
// tensor names, shapes and per-tensor types (see profiles.hpp), seeded
// random weights and a real tokenizer. Tensors are generated and quantized
// on every core and streamed to disk, so a 20B-parameter file never has to
// fit in memory.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

namespace eh::tools {

struct ForgeOptions {
    std::string profile;
    std::string out;
    uint64_t seed = 0;
    std::string vocab;         // "" = the profile's default from the testdata dir; "none" = synthetic
    unsigned threads = 0;      // 0 = all cores
    std::function<void(const std::string&)> log;  // progress lines; may be empty
    std::string mmproj_out;    // a vision profile's projector GGUF (required for one, refused otherwise)
};

// A toy Gemma 3 mmproj for a text model of width `text_embd`
// (forge_mmproj.cpp). Throws eh::Error when it cannot write.
void write_gemma3_mmproj(const std::string& path, uint32_t text_embd, uint64_t seed);
// Gemma 3's mmproj at real size (SigLIP-So400m at 896 pixels, F16
// matrices) for a text model of width `text_embd`, likewise.
void write_gemma3_siglip_mmproj(const std::string& path, uint32_t text_embd, uint64_t seed);
// A Gemma 3 mmproj of any tower shape (the two above are two of them):
// image pixels a side, patch, width, MLP width, layers, heads, pooling
// (0: no scale_factor key, Gemma 3's 4), matrices F16 or F32.
struct Gemma3Tower {
    const char* name;
    uint32_t image, patch, width, ff, layers, heads, merge;
    bool f16;
};
void write_gemma3_tower(const std::string& path, uint32_t text_embd, uint64_t seed, const Gemma3Tower& tower);
// A toy Qwen2.5-VL mmproj (clip.projector_type qwen2.5vl_merger) likewise.
void write_qwen25vl_mmproj(const std::string& path, uint32_t text_embd, uint64_t seed);
// A Qwen2.5-VL mmproj of any tower shape (the toy is one of them): patch,
// width, MLP width, blocks, heads, the full-attention period
// (clip.vision.n_wa_pattern), matrices F16 or F32. Qwen2.5-VL 7B's: 14,
// 1280, 3420, 32, 16, 8, F16.
struct QwenVlTower {
    const char* name;
    uint32_t patch, width, ff, layers, heads, wa_pattern;
    bool f16;
};
void write_qwen25vl_tower(const std::string& path, uint32_t text_embd, uint64_t seed, const QwenVlTower& tower);

struct ForgeResult {
    uint64_t n_tensors = 0;
    uint64_t file_bytes = 0;
    uint64_t n_vocab = 0;
    std::map<std::string, int> census;
    std::string vocab_source;
    double seconds = 0;
};

// Throws eh::Error: InvalidRequest (unknown profile), NotFound (vocab
// file), ModelLoadFailed (malformed vocab), Internal (I/O).
ForgeResult forge(const ForgeOptions& options);

// Fills out[0..n) with the deterministic values of elements
// [first, first+n) of a tensor: `scale` * z + `offset`, z ~ N(0,1)
// (approximated by a sum of four uniforms). Depends only on the arguments,
// never on the thread layout.
void synth_values(uint64_t tensor_seed, uint64_t first, uint64_t n, float scale, float offset, float* out);
uint64_t tensor_seed(uint64_t seed, const std::string& name);

}  // namespace eh::tools
