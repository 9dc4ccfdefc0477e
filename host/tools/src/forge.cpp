#include "eh/tools/forge.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include <engine_host/quant_blocks.hpp>
#include <engine_host/tensor_types.h>

#include "eh/error.hpp"
#include "eh/model/gguf_writer.hpp"
#include "eh/tools/parallel.hpp"
#include "eh/tools/profiles.hpp"
#include "eh/tools/vocab.hpp"
#include "row_stream.hpp"

namespace eh::tools {

namespace fs = std::filesystem;
using model::GgufValue;

namespace {

inline uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

void produce_tensor(const TensorSpec& t, uint64_t seed, WorkerPool& pool, model::ByteSink& sink) {
    uint64_t rows = 1;
    for (size_t d = 1; d < t.dims.size(); ++d) rows *= t.dims[d];
    const uint64_t ne0 = t.dims[0];
    const uint64_t ts = tensor_seed(seed, t.name);
    const float offset = t.init == Init::Ones ? 1.0f : 0.0f;
    if (t.init == Init::Values && t.values.size() != ne0 * rows)
        throw Error(Code::Internal, fmt::format("forge: '{}' has {} values for {} elements", t.name, t.values.size(), ne0 * rows));
    detail::stream_rows(t.name, t.type, ne0, rows, pool, sink, [&](uint64_t first, uint64_t n, float* out) {
        if (t.init == Init::Values) std::copy_n(t.values.begin() + first * ne0, n * ne0, out);
        else synth_values(ts, first * ne0, n * ne0, t.scale, offset, out);
    });
}

std::string resolve_vocab(const Profile& p, const std::string& requested) {
    if (!requested.empty()) return requested;
    const std::string dir = testdata_dir();
    if (dir.empty()) return "none";
    const std::string path = (fs::path(dir) / p.vocab.default_source).string();
    return fs::exists(path) ? path : "none";
}

}  // namespace

uint64_t tensor_seed(uint64_t seed, const std::string& name) {
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
    for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
    return splitmix64(seed ^ h);
}

void synth_values(uint64_t ts, uint64_t first, uint64_t n, float scale, float offset, float* out) {
    // Sum of four 16-bit uniforms: mean 2*65535, sd 65536/sqrt(3) (close enough).
    constexpr float kMean = 131070.0f;
    constexpr float kInvSd = 1.0f / 37837.23f;
    for (uint64_t i = 0; i < n; ++i) {
        const uint64_t h = splitmix64(ts + (first + i) * 0xD1B54A32D192ED03ull);
        const uint32_t s = static_cast<uint32_t>(h & 0xFFFF) + static_cast<uint32_t>((h >> 16) & 0xFFFF) +
                           static_cast<uint32_t>((h >> 32) & 0xFFFF) + static_cast<uint32_t>(h >> 48);
        out[i] = offset + scale * ((static_cast<float>(s) - kMean) * kInvSd);
    }
}

ForgeResult forge(const ForgeOptions& o) {
    const auto t0 = std::chrono::steady_clock::now();
    auto log = [&](const std::string& s) { if (o.log) o.log(s); };
    if (o.out.empty()) throw Error(Code::InvalidRequest, "forge: --out is required");
    const Profile p = find_profile(o.profile);

    const std::string vocab_path = resolve_vocab(p, o.vocab);
    Vocab vocab;
    if (vocab_path == "none") {
        log(fmt::format("warning: no vocabulary found (looked for {} in the testdata dir); using a synthetic one",
                        p.vocab.default_source));
        vocab = synthetic_vocab(p.n_vocab);
    } else {
        log(fmt::format("vocabulary: {}", vocab_path));
        vocab = load_vocab(vocab_path, p.n_vocab, p.vocab.pre, p.vocab.extra);
    }
    if (p.vision != !o.mmproj_out.empty())
        throw Error(Code::InvalidRequest, p.vision ? fmt::format("forge: profile '{}' has a vision tower: give --mmproj-out FILE", p.name)
                                                   : fmt::format("forge: profile '{}' has no vision tower (--mmproj-out)", p.name));
    for (auto& [key, value] : vocab.kv) {  // the profile's control tokens over [PAD] entries
        if (p.control_tokens.empty()) break;
        if (key == "tokenizer.ggml.tokens") {
            std::vector<std::string> t = value.strings();
            for (const auto& [id, text] : p.control_tokens)
                if (id < t.size()) t[id] = text;
            value = GgufValue::string_array(std::move(t));
        } else if (key == "tokenizer.ggml.token_type" && value.elem_type() == EH_VALUE_I32) {
            std::vector<int32_t> t(value.count());
            std::memcpy(t.data(), value.bytes().data(), t.size() * sizeof(int32_t));
            for (const auto& [id, text] : p.control_tokens)
                if (id < t.size()) t[id] = 3;  // control
            value = GgufValue::array(std::span<const int32_t>(t));
        }
    }
    const std::vector<TensorSpec> tensors = p.tensors(vocab.n_tokens);

    model::GgufWriter w;
    for (const auto& [k, v] : p.metadata) w.set(k, v);
    w.set("general.file_type", GgufValue::u32(p.target.file_type()));
    for (const auto& [k, v] : vocab.kv) w.set(k, v);
    w.set("general.quantization_version", GgufValue::u32(2));

    WorkerPool pool(o.threads);
    size_t done = 0;
    for (const auto& t : tensors) {
        w.add_tensor(t.name, t.type, t.dims, [&, seed = o.seed](model::ByteSink& sink) {
            produce_tensor(t, seed, pool, sink);
            ++done;
            if (t.dims.size() >= 2 && (done % 16 == 0 || t.name.find("exps") != std::string::npos || t.dims[1] > 100000))
                log(fmt::format("[{}/{}] {}", done, tensors.size(), t.name));
        });
    }

    w.write(o.out);
    if (p.vision && p.arch == "qwen2vl" && p.tiny) write_qwen25vl_mmproj(o.mmproj_out, p.shape.n_embd, o.seed);
    else if (p.vision && p.arch == "qwen2vl")  // Qwen2.5-VL 7B's tower (F16, as the converter's mmproj-model-f16)
        write_qwen25vl_tower(o.mmproj_out, p.shape.n_embd, o.seed,
                             {"Qwen2.5-VL 7B vision (forged)", 14, 1280, 3420, 32, 16, 8, true});
    else if (p.vision && p.tiny) write_gemma3_mmproj(o.mmproj_out, p.shape.n_embd, o.seed);
    else if (p.vision) write_gemma3_siglip_mmproj(o.mmproj_out, p.shape.n_embd, o.seed);

    ForgeResult r;
    r.n_tensors = tensors.size();
    r.file_bytes = fs::file_size(o.out);
    r.n_vocab = vocab.n_tokens;
    r.census = census(tensors);
    r.vocab_source = vocab.source;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
}

}  // namespace eh::tools
