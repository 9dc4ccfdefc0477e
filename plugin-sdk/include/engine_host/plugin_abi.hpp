// Header-only C++17 helper for plugin authors. Optional: the C header alone
// is the contract. What it gives:
//   - ehp::Error, an exception carrying an eh_status, and ehp::guard(), which
//     runs a body and turns every exception into a status + message, so no
//     exception ever crosses the ABI;
//   - ehp::ModelView, typed read access to the host's eh_model_view
//     (metadata lookups that throw a clear MODEL_LOAD_FAILED, tensor lookup);
//   - ehp::check_sampling, the ranges of eh_sampling_params every plugin
//     enforces, with one set of messages.
#ifndef ENGINE_HOST_PLUGIN_ABI_HPP
#define ENGINE_HOST_PLUGIN_ABI_HPP

#include <cmath>
#include <cstddef>
#include <cstring>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <engine_host/plugin_abi.h>
#include <engine_host/tensor_types.h>

namespace ehp {

class Error : public std::runtime_error {
public:
    Error(eh_status status, const std::string& message)
        : std::runtime_error(message), status_(status) {}
    eh_status status() const noexcept { return status_; }

private:
    eh_status status_;
};

// Runs `body` (returning void or eh_status). Any exception becomes a status
// and its message is stored in `last_error`. On success `last_error` is
// cleared, so a message always belongs to the most recent call.
template <class Body>
eh_status guard(std::string& last_error, Body&& body) noexcept {
    try {
        last_error.clear();
        if constexpr (std::is_same_v<decltype(body()), void>) {
            body();
            return EH_OK;
        } else {
            return body();
        }
    } catch (const Error& e) {
        last_error = e.what();
        return e.status();
    } catch (const std::bad_alloc&) {
        last_error = "out of host memory";
        return EH_INTERNAL;
    } catch (const std::exception& e) {
        try { last_error = e.what(); } catch (...) {}
        return EH_INTERNAL;
    } catch (...) {
        try { last_error = "unknown exception"; } catch (...) {}
        return EH_INTERNAL;
    }
}

// Greedy sampling with every other stage neutral (temperature 0, top_k 0,
// top_p 1, min_p 0, no penalties, window -1, seed 0): the host's tools and
// harnesses that compare tokens across runs use it.
inline eh_sampling_params greedy_sampling() {
    eh_sampling_params p{};
    p.struct_size = sizeof(p);
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    p.repetition_window = -1;
    return p;
}

// Throws Error(EH_INVALID_ARGUMENT) naming the first field out of range.
// presence/frequency_penalty are checked when struct_size covers them (1.2).
inline void check_sampling(const eh_sampling_params& p) {
    auto bad = [](const std::string& what) { throw Error(EH_INVALID_ARGUMENT, "sampling: " + what); };
    if (!std::isfinite(p.temperature) || p.temperature < 0.0f) bad("temperature must be a finite value >= 0");
    if (p.top_k < 0) bad("top_k must be >= 0 (0 = off)");
    if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) bad("top_p must be in (0, 1]");
    if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) bad("min_p must be in [0, 1]");
    if (!std::isfinite(p.repetition_penalty) || p.repetition_penalty <= 0.0f)
        bad("repetition_penalty must be a finite value > 0");
    if (p.repetition_window < -1) bad("repetition_window must be >= -1 (-1 = all)");
    if (p.struct_size >= offsetof(eh_sampling_params, frequency_penalty) + sizeof(float)) {
        if (!std::isfinite(p.presence_penalty) || std::fabs(p.presence_penalty) > 2.0f)
            bad("presence_penalty must be in [-2, 2]");
        if (!std::isfinite(p.frequency_penalty) || std::fabs(p.frequency_penalty) > 2.0f)
            bad("frequency_penalty must be in [-2, 2]");
    }
}

// Per-thread message for calls without an object (probe, model_load).
inline std::string& thread_last_error() {
    thread_local std::string message;
    return message;
}

inline std::string_view to_sv(const eh_string& s) {
    return s.data ? std::string_view(s.data, static_cast<size_t>(s.size)) : std::string_view();
}

// Read-only typed access to a host model view.
class ModelView {
public:
    explicit ModelView(const eh_model_view* view) : v_(view) {
        if (!v_) throw Error(EH_INVALID_ARGUMENT, "model view is NULL");
    }

    const eh_model_view& raw() const { return *v_; }
    std::string_view architecture() const { return to_sv(v_->architecture); }

    const eh_value* find(std::string_view key) const {
        for (uint64_t i = 0; i < v_->n_metadata; ++i)
            if (to_sv(v_->metadata[i].key) == key) return &v_->metadata[i].value;
        return nullptr;
    }

    // "{arch}.name" lookups, the way GGUF names hyperparameters.
    std::string arch_key(std::string_view suffix) const {
        return std::string(architecture()) + "." + std::string(suffix);
    }

    std::optional<uint64_t> get_uint(std::string_view key) const {
        const eh_value* v = find(key);
        if (!v) return std::nullopt;
        switch (v->type) {
        case EH_VALUE_U8: case EH_VALUE_U16: case EH_VALUE_U32: case EH_VALUE_U64:
        case EH_VALUE_BOOL:
            return v->v.u64;
        case EH_VALUE_I8: case EH_VALUE_I16: case EH_VALUE_I32: case EH_VALUE_I64:
            if (v->v.i64 < 0) throw Error(EH_MODEL_LOAD_FAILED, "metadata '" + std::string(key) + "' is negative");
            return static_cast<uint64_t>(v->v.i64);
        default:
            throw Error(EH_MODEL_LOAD_FAILED, "metadata '" + std::string(key) + "' is not an integer");
        }
    }

    std::optional<double> get_float(std::string_view key) const {
        const eh_value* v = find(key);
        if (!v) return std::nullopt;
        switch (v->type) {
        case EH_VALUE_F32: case EH_VALUE_F64: return v->v.f64;
        case EH_VALUE_U8: case EH_VALUE_U16: case EH_VALUE_U32: case EH_VALUE_U64:
            return static_cast<double>(v->v.u64);
        case EH_VALUE_I8: case EH_VALUE_I16: case EH_VALUE_I32: case EH_VALUE_I64:
            return static_cast<double>(v->v.i64);
        default:
            throw Error(EH_MODEL_LOAD_FAILED, "metadata '" + std::string(key) + "' is not a number");
        }
    }

    std::optional<std::string_view> get_string(std::string_view key) const {
        const eh_value* v = find(key);
        if (!v) return std::nullopt;
        if (v->type != EH_VALUE_STRING)
            throw Error(EH_MODEL_LOAD_FAILED, "metadata '" + std::string(key) + "' is not a string");
        return to_sv(v->v.str);
    }

    uint64_t require_uint(std::string_view key) const {
        auto v = get_uint(key);
        if (!v) throw Error(EH_MODEL_LOAD_FAILED, "missing metadata '" + std::string(key) + "'");
        return *v;
    }

    double require_float(std::string_view key) const {
        auto v = get_float(key);
        if (!v) throw Error(EH_MODEL_LOAD_FAILED, "missing metadata '" + std::string(key) + "'");
        return *v;
    }

    const eh_tensor* find_tensor(std::string_view name) const {
        for (uint64_t i = 0; i < v_->n_tensors; ++i)
            if (to_sv(v_->tensors[i].name) == name) return &v_->tensors[i];
        return nullptr;
    }

    const eh_tensor& require_tensor(std::string_view name) const {
        const eh_tensor* t = find_tensor(name);
        if (!t) throw Error(EH_MODEL_LOAD_FAILED, "missing tensor '" + std::string(name) + "'");
        return *t;
    }

private:
    const eh_model_view* v_;
};

// Name of a tensor type, or "type#N" for ids without a name.
inline std::string type_name(uint32_t type) {
    eh_type_traits t = eh_tensor_type_traits(type);
    return t.name ? std::string(t.name) : "type#" + std::to_string(type);
}

// Fills a versioned out-struct the caller owns (eh_probe_result,
// eh_model_info): `fill` gets a zeroed full-size copy, and only the prefix the
// caller's struct_size covers is written back, so an older caller's smaller
// struct is never overrun. struct_size 0 is taken as "this header's size".
template <class T, class Fill>
void fill_versioned(T* out, Fill&& fill) {
    uint32_t size = out->struct_size == 0 || out->struct_size > sizeof(T) ? uint32_t(sizeof(T)) : out->struct_size;
    T tmp{};
    fill(tmp);
    tmp.struct_size = size;
    std::memcpy(static_cast<void*>(out), &tmp, size);
}

// Copies `text` into a fixed char array, always NUL-terminated.
template <size_t N>
void copy_fixed(char (&dst)[N], std::string_view text) {
    size_t n = text.size() < N - 1 ? text.size() : N - 1;
    std::memcpy(dst, text.data(), n);
    dst[n] = '\0';
}

}  // namespace ehp

#endif  // ENGINE_HOST_PLUGIN_ABI_HPP
