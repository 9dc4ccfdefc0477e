#include "eh/model/model_file.hpp"

#include <filesystem>
#include <fmt/format.h>

#include <engine_host/tensor_types.h>

#include "eh/error.hpp"
#include "model_data.hpp"

namespace eh::model {

namespace detail {

bool ModelData::add_kv(std::string_view key, const eh_value& value) {
    if (key_index.count(key)) return false;
    eh_metadata_kv kv{intern(key), value};
    metadata.push_back(kv);
    key_index.emplace(to_sv(kv.key), metadata.size() - 1);
    return true;
}

bool ModelData::add_tensor(const eh_tensor& t) {
    if (tensor_index.count(to_sv(t.name))) return false;
    tensors.push_back(t);
    tensor_index.emplace(to_sv(t.name), tensors.size() - 1);
    return true;
}

void ModelData::set_string(std::string_view key, std::string_view value) {
    eh_value v{};
    v.type = EH_VALUE_STRING;
    v.count = 1;
    v.v.str = intern(value);
    add_kv(key, v);
}

void ModelData::set_u32(std::string_view key, uint32_t value) {
    eh_value v{};
    v.type = EH_VALUE_U32;
    v.count = 1;
    v.v.u64 = value;
    add_kv(key, v);
}

void ModelData::set_f32(std::string_view key, float value) {
    eh_value v{};
    v.type = EH_VALUE_F32;
    v.count = 1;
    v.v.f64 = static_cast<double>(value);
    add_kv(key, v);
}

void ModelData::set_bool(std::string_view key, bool value) {
    eh_value v{};
    v.type = EH_VALUE_BOOL;
    v.count = 1;
    v.v.u64 = value ? 1 : 0;
    add_kv(key, v);
}

void ModelData::finish() {
    view = eh_model_view{};
    view.struct_size = sizeof(eh_model_view);
    view.format = format;
    view.architecture = eh_string{"", 0};
    auto it = key_index.find("general.architecture");
    if (it != key_index.end() && metadata[it->second].value.type == EH_VALUE_STRING)
        view.architecture = metadata[it->second].value.v.str;
    view.n_metadata = metadata.size();
    view.metadata = metadata.empty() ? nullptr : metadata.data();
    view.n_tensors = tensors.size();
    view.tensors = tensors.empty() ? nullptr : tensors.data();
}

std::unique_ptr<ModelFile> ModelData::make_file(std::unique_ptr<ModelData> d) {
    d->finish();
    return std::unique_ptr<ModelFile>(new ModelFile(std::move(d)));
}

}  // namespace detail

namespace {

[[noreturn]] void type_error(std::string_view key, const char* wanted, const eh_value& v) {
    throw Error(Code::ModelLoadFailed, fmt::format("metadata '{}' is {}, expected {}", key,
                                                   value_type_name(v.type), wanted));
}

bool is_unsigned(uint32_t t) {
    return t == EH_VALUE_U8 || t == EH_VALUE_U16 || t == EH_VALUE_U32 || t == EH_VALUE_U64;
}
bool is_signed(uint32_t t) {
    return t == EH_VALUE_I8 || t == EH_VALUE_I16 || t == EH_VALUE_I32 || t == EH_VALUE_I64;
}

}  // namespace

const char* value_type_name(uint32_t type) {
    switch (type) {
    case EH_VALUE_U8: return "u8";
    case EH_VALUE_I8: return "i8";
    case EH_VALUE_U16: return "u16";
    case EH_VALUE_I16: return "i16";
    case EH_VALUE_U32: return "u32";
    case EH_VALUE_I32: return "i32";
    case EH_VALUE_F32: return "f32";
    case EH_VALUE_BOOL: return "bool";
    case EH_VALUE_STRING: return "string";
    case EH_VALUE_ARRAY: return "array";
    case EH_VALUE_U64: return "u64";
    case EH_VALUE_I64: return "i64";
    case EH_VALUE_F64: return "f64";
    }
    return "unknown";
}

std::string tensor_type_name(uint32_t type) {
    eh_type_traits t = eh_tensor_type_traits(type);
    return t.name ? std::string(t.name) : fmt::format("type#{}", type);
}

std::unique_ptr<ModelFile> ModelFile::open(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    auto st = fs::status(path, ec);
    if (ec || !fs::exists(st))
        throw Error(Code::ModelLoadFailed, fmt::format("model path '{}' does not exist", path));
    auto d = std::make_unique<detail::ModelData>();
    d->path = path;
    if (fs::is_directory(st)) {
        d->format = EH_FORMAT_SAFETENSORS;
        detail::read_hf_directory(*d, path);
    } else {
        if (path.size() >= 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0)
            throw Error(Code::ModelLoadFailed,
                        fmt::format("'{}' is a bare safetensors file; pass the Hugging Face model directory "
                                    "(with config.json and tokenizer.json) instead",
                                    path));
        auto file = detail::MappedFile::open(path);
        d->format = EH_FORMAT_GGUF;
        d->weight_files.push_back(path);
        detail::read_gguf(*d, std::move(file), path);
        detail::read_gguf_shards(*d);
    }
    return detail::ModelData::make_file(std::move(d));
}

std::unique_ptr<ModelFile> ModelFile::open_gguf_buffer(const void* data, size_t size,
                                                       const std::string& label) {
    auto d = std::make_unique<detail::ModelData>();
    d->path = label;
    d->format = EH_FORMAT_GGUF;
    detail::read_gguf(*d, detail::MappedFile::from_buffer(data, size), label);
    return detail::ModelData::make_file(std::move(d));
}

ModelFile::ModelFile(std::unique_ptr<detail::ModelData> data) : d_(std::move(data)) {}
ModelFile::~ModelFile() = default;

const eh_model_view& ModelFile::view() const { return d_->view; }
const std::string& ModelFile::path() const { return d_->path; }
eh_model_format ModelFile::format() const { return d_->format; }
std::string ModelFile::format_name() const {
    return d_->format == EH_FORMAT_GGUF ? "gguf" : "safetensors";
}
std::string_view ModelFile::architecture() const { return to_sv(d_->view.architecture); }
uint32_t ModelFile::gguf_version() const { return d_->gguf_version; }
uint64_t ModelFile::alignment() const { return d_->alignment; }
uint64_t ModelFile::data_offset() const { return d_->data_offset; }
uint64_t ModelFile::file_size() const { return d_->file_size; }
const std::vector<std::string>& ModelFile::weight_files() const { return d_->weight_files; }

std::span<const eh_metadata_kv> ModelFile::metadata() const { return d_->metadata; }

const eh_value* ModelFile::find(std::string_view key) const {
    auto it = d_->key_index.find(key);
    return it == d_->key_index.end() ? nullptr : &d_->metadata[it->second].value;
}

std::string ModelFile::arch_key(std::string_view suffix) const {
    return fmt::format("{}.{}", architecture(), suffix);
}

std::optional<uint64_t> ModelFile::get_uint(std::string_view key) const {
    const eh_value* v = find(key);
    if (!v) return std::nullopt;
    if (is_unsigned(v->type)) return v->v.u64;
    if (is_signed(v->type)) {
        if (v->v.i64 < 0)
            throw Error(Code::ModelLoadFailed, fmt::format("metadata '{}' is negative ({})", key, v->v.i64));
        return static_cast<uint64_t>(v->v.i64);
    }
    type_error(key, "an unsigned integer", *v);
}

std::optional<int64_t> ModelFile::get_int(std::string_view key) const {
    const eh_value* v = find(key);
    if (!v) return std::nullopt;
    if (is_signed(v->type)) return v->v.i64;
    if (is_unsigned(v->type)) {
        if (v->v.u64 > static_cast<uint64_t>(INT64_MAX))
            throw Error(Code::ModelLoadFailed, fmt::format("metadata '{}' does not fit in int64", key));
        return static_cast<int64_t>(v->v.u64);
    }
    type_error(key, "an integer", *v);
}

std::optional<double> ModelFile::get_float(std::string_view key) const {
    const eh_value* v = find(key);
    if (!v) return std::nullopt;
    if (v->type == EH_VALUE_F32 || v->type == EH_VALUE_F64) return v->v.f64;
    if (is_unsigned(v->type)) return static_cast<double>(v->v.u64);
    if (is_signed(v->type)) return static_cast<double>(v->v.i64);
    type_error(key, "a number", *v);
}

std::optional<bool> ModelFile::get_bool(std::string_view key) const {
    const eh_value* v = find(key);
    if (!v) return std::nullopt;
    if (v->type == EH_VALUE_BOOL) return v->v.u64 != 0;
    type_error(key, "a bool", *v);
}

std::optional<std::string_view> ModelFile::get_string(std::string_view key) const {
    const eh_value* v = find(key);
    if (!v) return std::nullopt;
    if (v->type == EH_VALUE_STRING) return to_sv(v->v.str);
    type_error(key, "a string", *v);
}

std::optional<ArrayRef> ModelFile::get_array(std::string_view key) const {
    const eh_value* v = find(key);
    if (!v) return std::nullopt;
    if (v->type != EH_VALUE_ARRAY) type_error(key, "an array", *v);
    return ArrayRef{v->elem_type, v->count, v->v.array};
}

uint64_t ModelFile::require_uint(std::string_view key) const {
    auto v = get_uint(key);
    if (!v) throw Error(Code::ModelLoadFailed, fmt::format("missing metadata '{}'", key));
    return *v;
}

double ModelFile::require_float(std::string_view key) const {
    auto v = get_float(key);
    if (!v) throw Error(Code::ModelLoadFailed, fmt::format("missing metadata '{}'", key));
    return *v;
}

std::string_view ModelFile::require_string(std::string_view key) const {
    auto v = get_string(key);
    if (!v) throw Error(Code::ModelLoadFailed, fmt::format("missing metadata '{}'", key));
    return *v;
}

namespace {
template <class T>
std::span<const T> typed_array(const ModelFile& f, std::string_view key, uint32_t elem, const char* what) {
    auto a = f.get_array(key);
    if (!a) return {};
    if (a->elem_type != elem)
        throw Error(Code::ModelLoadFailed, fmt::format("metadata '{}' is an array of {}, expected {}", key,
                                                       value_type_name(a->elem_type), what));
    return a->as<T>();
}
}  // namespace

std::span<const eh_string> ModelFile::get_string_array(std::string_view key) const {
    return typed_array<eh_string>(*this, key, EH_VALUE_STRING, "string");
}
std::span<const float> ModelFile::get_f32_array(std::string_view key) const {
    return typed_array<float>(*this, key, EH_VALUE_F32, "f32");
}
std::span<const int32_t> ModelFile::get_i32_array(std::string_view key) const {
    return typed_array<int32_t>(*this, key, EH_VALUE_I32, "i32");
}

std::optional<std::vector<int64_t>> ModelFile::get_int_array(std::string_view key) const {
    auto a = get_array(key);
    if (!a) return std::nullopt;
    std::vector<int64_t> out;
    out.reserve(static_cast<size_t>(a->count));
    auto widen = [&](auto tag) {
        using T = decltype(tag);
        for (T x : a->as<T>()) out.push_back(static_cast<int64_t>(x));
    };
    switch (a->elem_type) {
    case EH_VALUE_U8: widen(uint8_t{}); break;
    case EH_VALUE_I8: widen(int8_t{}); break;
    case EH_VALUE_U16: widen(uint16_t{}); break;
    case EH_VALUE_I16: widen(int16_t{}); break;
    case EH_VALUE_U32: widen(uint32_t{}); break;
    case EH_VALUE_I32: widen(int32_t{}); break;
    case EH_VALUE_I64: widen(int64_t{}); break;
    case EH_VALUE_U64:
        for (uint64_t x : a->as<uint64_t>()) {
            if (x > static_cast<uint64_t>(INT64_MAX))
                throw Error(Code::ModelLoadFailed, fmt::format("metadata '{}' has an element beyond int64", key));
            out.push_back(static_cast<int64_t>(x));
        }
        break;
    default:
        throw Error(Code::ModelLoadFailed, fmt::format("metadata '{}' is an array of {}, expected integers", key,
                                                       value_type_name(a->elem_type)));
    }
    return out;
}

std::span<const eh_tensor> ModelFile::tensors() const { return d_->tensors; }

const eh_tensor* ModelFile::find_tensor(std::string_view name) const {
    auto it = d_->tensor_index.find(name);
    return it == d_->tensor_index.end() ? nullptr : &d_->tensors[it->second];
}

}  // namespace eh::model
