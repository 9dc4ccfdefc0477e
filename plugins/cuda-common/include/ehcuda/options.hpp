// The load's options_json (eh_load_params::options_json), read once with
// typed getters. Host code only (no CUDA), so it is tested without a GPU.
//
// Every error is EH_INVALID_ARGUMENT and names the key: "options: \"key\"
// must be an integer in [lo, hi]". Unknown keys are refused (a typo such as
// "fp16_weight" would otherwise load with the default and say nothing): the
// reader is built with the keys its plugin takes, and check_known() names
// the first key outside them and lists the known ones. A missing or empty
// options_json reads as {}.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ehcuda {

class Options {
public:
    // Parses `json` (NULL or "" = {}); INVALID_ARGUMENT when it is not a
    // JSON object or longer than kMaxBytes. `where` prefixes every message
    // ("options" at the top level, "options.kernels" for a nested object).
    static constexpr size_t kMaxBytes = 64 * 1024;
    explicit Options(const char* json, std::string where = "options");

    bool has(std::string_view key) const;
    // An integer in [lo, hi] (a JSON number without fraction), or dflt when absent.
    int64_t integer(std::string_view key, int64_t dflt, int64_t lo, int64_t hi) const;
    // true / false, or dflt when absent.
    bool boolean(std::string_view key, bool dflt) const;
    // One of `names` (a JSON string); the index of the match, or dflt when absent.
    int choice(std::string_view key, int dflt, std::initializer_list<std::string_view> names) const;
    // A nested object (absent: an empty one), with its own known keys.
    Options object(std::string_view key) const;
    // INVALID_ARGUMENT naming the first key not in `known`.
    void check_known(std::initializer_list<std::string_view> known) const;
    void check_known(const std::vector<std::string_view>& known) const;
    // The keys present, in document order.
    std::vector<std::string> keys() const;

    const std::string& where() const { return where_; }

private:
    struct Impl;  // the parsed document and this object within it
    Options(std::shared_ptr<const Impl> impl, std::string where);
    [[noreturn]] void fail(std::string_view key, const std::string& want) const;

    std::shared_ptr<const Impl> impl_;  // null: an empty object
    std::string where_;
};

}  // namespace ehcuda
