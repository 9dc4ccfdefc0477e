#include "ehcuda/options.hpp"

#include <simdjson.h>

#include <cstring>

#include <engine_host/plugin_abi.hpp>

namespace ehcuda {

struct Options::Impl {
    std::shared_ptr<simdjson::dom::parser> parser;  // owns the document the object points into
    simdjson::dom::object obj;
};

namespace {

std::string in_quotes(std::string_view key) { return "\"" + std::string(key) + "\""; }

}  // namespace

Options::Options(std::shared_ptr<const Impl> impl, std::string where)
    : impl_(std::move(impl)), where_(std::move(where)) {}

Options::Options(const char* json, std::string where) : where_(std::move(where)) {
    const size_t n = json ? std::strlen(json) : 0;
    if (n > kMaxBytes)
        throw ehp::Error(EH_INVALID_ARGUMENT, where_ + ": longer than " + std::to_string(kMaxBytes) + " bytes");
    size_t i = 0;
    while (i < n && (json[i] == ' ' || json[i] == '\t' || json[i] == '\n' || json[i] == '\r')) ++i;
    if (i == n) return;  // absent or blank: {}
    auto impl = std::make_shared<Impl>();
    impl->parser = std::make_shared<simdjson::dom::parser>();
    simdjson::dom::element root;
    if (impl->parser->parse(simdjson::padded_string(json, n)).get(root) != simdjson::SUCCESS ||
        root.get_object().get(impl->obj) != simdjson::SUCCESS)
        throw ehp::Error(EH_INVALID_ARGUMENT, where_ + ": not a JSON object");
    impl_ = std::move(impl);
}

void Options::fail(std::string_view key, const std::string& want) const {
    throw ehp::Error(EH_INVALID_ARGUMENT, where_ + ": " + in_quotes(key) + " must be " + want);
}

bool Options::has(std::string_view key) const {
    simdjson::dom::element e;
    return impl_ && impl_->obj.at_key(key).get(e) == simdjson::SUCCESS;
}

int64_t Options::integer(std::string_view key, int64_t dflt, int64_t lo, int64_t hi) const {
    simdjson::dom::element e;
    if (!impl_ || impl_->obj.at_key(key).get(e) != simdjson::SUCCESS) return dflt;
    const std::string want = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    int64_t v = 0;
    if (e.is_int64()) {
        v = int64_t(e.get_int64());
    } else if (e.is_uint64()) {
        fail(key, want);  // past INT64_MAX: above any hi
    } else {
        fail(key, want);
    }
    if (v < lo || v > hi) fail(key, want);
    return v;
}

bool Options::boolean(std::string_view key, bool dflt) const {
    simdjson::dom::element e;
    if (!impl_ || impl_->obj.at_key(key).get(e) != simdjson::SUCCESS) return dflt;
    bool v = false;
    if (e.get_bool().get(v) != simdjson::SUCCESS) fail(key, "true or false");
    return v;
}

int Options::choice(std::string_view key, int dflt, std::initializer_list<std::string_view> names) const {
    std::string want;
    for (std::string_view n : names) want += (want.empty() ? "" : names.size() > 2 ? ", " : " or ") + in_quotes(n);
    simdjson::dom::element e;
    if (!impl_ || impl_->obj.at_key(key).get(e) != simdjson::SUCCESS) return dflt;
    std::string_view s;
    if (e.get_string().get(s) != simdjson::SUCCESS) fail(key, "one of " + want);
    int i = 0;
    for (std::string_view n : names) {
        if (n == s) return i;
        ++i;
    }
    fail(key, "one of " + want);
}

Options Options::object(std::string_view key) const {
    const std::string where = where_ + "." + std::string(key);
    simdjson::dom::element e;
    if (!impl_ || impl_->obj.at_key(key).get(e) != simdjson::SUCCESS) return Options(nullptr, where);
    auto sub = std::make_shared<Impl>();
    sub->parser = impl_->parser;
    if (e.get_object().get(sub->obj) != simdjson::SUCCESS) fail(key, "a JSON object");
    return Options(std::shared_ptr<const Impl>(std::move(sub)), where);
}

std::vector<std::string> Options::keys() const {
    std::vector<std::string> out;
    if (impl_)
        for (auto field : impl_->obj) out.emplace_back(field.key);
    return out;
}

void Options::check_known(const std::vector<std::string_view>& known) const {
    for (const std::string& k : keys()) {
        bool ok = false;
        for (std::string_view n : known) ok |= n == k;
        if (ok) continue;
        std::string list;
        for (std::string_view n : known) list += (list.empty() ? "" : ", ") + in_quotes(n);
        throw ehp::Error(EH_INVALID_ARGUMENT, where_ + ": unknown key " + in_quotes(k) + " (known: " + list + ")");
    }
}

void Options::check_known(std::initializer_list<std::string_view> known) const {
    check_known(std::vector<std::string_view>(known));
}

}  // namespace ehcuda
