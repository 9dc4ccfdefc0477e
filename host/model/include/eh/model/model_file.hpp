// A model file opened for inspection and loading: a GGUF file (v2 or v3) or a
// Hugging Face model directory (config.json + tokenizer.json + safetensors).
//
// Everything is validated against the file sizes when the file is opened;
// afterwards no accessor can read out of bounds. Tensor data is never copied:
// eh_tensor::data points into a read-only mmap held by the ModelFile.
// Metadata uses GGUF key names for both formats (see docs/models.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <engine_host/plugin_abi.h>

namespace eh::model {

namespace detail { struct ModelData; }

inline std::string_view to_sv(const eh_string& s) {
    return s.data ? std::string_view(s.data, static_cast<size_t>(s.size)) : std::string_view();
}

// Name of a metadata value type: "u32", "string", "array", ...
const char* value_type_name(uint32_t type);
// Name of a tensor type ("Q4_K"), or "type#N" for an id with no name.
std::string tensor_type_name(uint32_t type);

// A typed view of one metadata array. `data` is naturally aligned for the
// element type (uint8_t for bool, eh_string for strings, eh_value for nested
// arrays); it stays valid for the ModelFile's lifetime.
struct ArrayRef {
    uint32_t elem_type = 0;   // eh_value_type
    uint64_t count = 0;
    const void* data = nullptr;

    template <class T>
    std::span<const T> as() const { return {static_cast<const T*>(data), static_cast<size_t>(count)}; }
};

class ModelFile {
public:
    // A GGUF file or a Hugging Face model directory. Throws eh::Error
    // (Code::ModelLoadFailed) with a message naming the file, the field or
    // tensor at fault, and the byte offset where it applies.
    static std::unique_ptr<ModelFile> open(const std::string& path);
    // A GGUF image in memory (copied; the caller's buffer may go away).
    // For tests and the fuzzer. `label` stands in for the path in messages.
    static std::unique_ptr<ModelFile> open_gguf_buffer(const void* data, size_t size,
                                                       const std::string& label = "<buffer>");

    ~ModelFile();
    ModelFile(const ModelFile&) = delete;
    ModelFile& operator=(const ModelFile&) = delete;

    // The plugin ABI view. Every string and array it points at is owned by
    // this ModelFile and valid for its lifetime.
    const eh_model_view& view() const;
    const std::string& path() const;
    eh_model_format format() const;
    std::string format_name() const;          // "gguf" / "safetensors"
    std::string_view architecture() const;    // general.architecture ("" if absent)

    // GGUF layout facts (0 for safetensors).
    uint32_t gguf_version() const;
    uint64_t alignment() const;               // general.alignment (default 32)
    uint64_t data_offset() const;             // start of the tensor data section
    // Total bytes of the file (GGUF) or of all weight shards (safetensors).
    uint64_t file_size() const;
    // The weight files behind the view (one for GGUF; the shards of an HF dir).
    const std::vector<std::string>& weight_files() const;

    // ---- metadata ----------------------------------------------------------
    std::span<const eh_metadata_kv> metadata() const;
    const eh_value* find(std::string_view key) const;     // O(1); nullptr if absent
    bool has(std::string_view key) const { return find(key) != nullptr; }
    // "{architecture}.{suffix}", the way GGUF names hyperparameters.
    std::string arch_key(std::string_view suffix) const;

    // Typed getters: std::nullopt when the key is absent; eh::Error
    // (ModelLoadFailed) naming the key when it has an incompatible type.
    // Integers convert between widths when the value fits; get_float accepts
    // integers too; get_bool accepts bool only.
    std::optional<uint64_t> get_uint(std::string_view key) const;
    std::optional<int64_t> get_int(std::string_view key) const;
    std::optional<double> get_float(std::string_view key) const;
    std::optional<bool> get_bool(std::string_view key) const;
    std::optional<std::string_view> get_string(std::string_view key) const;
    std::optional<ArrayRef> get_array(std::string_view key) const;

    // Same, but a missing key is an error too.
    uint64_t require_uint(std::string_view key) const;
    double require_float(std::string_view key) const;
    std::string_view require_string(std::string_view key) const;

    // Element-typed array access; empty span when absent, error when the
    // key is not an array of exactly that element type.
    std::span<const eh_string> get_string_array(std::string_view key) const;
    std::span<const float> get_f32_array(std::string_view key) const;
    std::span<const int32_t> get_i32_array(std::string_view key) const;
    // Any integer array widened to int64 (copies); nullopt when absent.
    std::optional<std::vector<int64_t>> get_int_array(std::string_view key) const;

    // ---- tensors -----------------------------------------------------------
    std::span<const eh_tensor> tensors() const;
    const eh_tensor* find_tensor(std::string_view name) const;  // O(1)

private:
    explicit ModelFile(std::unique_ptr<detail::ModelData> data);
    friend struct detail::ModelData;
    std::unique_ptr<detail::ModelData> d_;
};

}  // namespace eh::model
