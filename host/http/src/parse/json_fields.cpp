#include "parse/json_fields.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "eh/service/utf8.hpp"

namespace eh::http::json {

using service::sanitize_utf8;

const char* type_name(element_type t) {
    switch (t) {
    case element_type::ARRAY: return "array";
    case element_type::OBJECT: return "object";
    case element_type::INT64: case element_type::UINT64: return "integer";
    case element_type::DOUBLE: return "number";
    case element_type::STRING: return "string";
    case element_type::BOOL: return "boolean";
    case element_type::NULL_VALUE: return "null";
    }
    return "unknown";
}

object parse_object(simdjson::dom::parser& parser, simdjson::padded_string& storage,
                    std::string_view body, const RequestLimits& limits) {
    if (body.size() > limits.max_body_bytes)
        throw RequestError("", fmt::format("request body is {} bytes; the limit is {} bytes", body.size(),
                                           limits.max_body_bytes));
    if (body.find_first_not_of(" \t\r\n") == std::string_view::npos)
        throw RequestError("", "request body is empty; expected a JSON object");
    storage = simdjson::padded_string(body);
    element root;
    if (auto err = parser.parse(storage).get(root))
        throw RequestError("", fmt::format("malformed JSON: {}", simdjson::error_message(err)));
    if (root.type() != element_type::OBJECT)
        throw RequestError("", fmt::format("request body must be a JSON object, not {}", type_name(root.type())));
    reject_duplicate_keys(root);
    return root.get_object().value_unsafe();
}

namespace {

// A step of the path to a value: an object's key or an array's index.
struct PathStep {
    std::string_view key;
    size_t index = 0;
    bool is_key = false;
};

std::string path_text(const std::vector<PathStep>& path, std::string_view last) {
    std::string out;
    for (const auto& s : path) {
        if (!s.is_key) {
            out += fmt::format("[{}]", s.index);
            continue;
        }
        if (!out.empty()) out += '.';
        out += sanitize_utf8(s.key.substr(0, 64));
    }
    if (!out.empty()) out += '.';
    return out + sanitize_utf8(last.substr(0, 64));
}

}  // namespace

// Depth-first with an explicit stack (simdjson allows 1,024 levels; no
// recursion on the server thread's stack). Each object's keys are checked
// when it is entered, so the first duplicate reported is the outermost one.
void reject_duplicate_keys(const element& root) {
    struct Frame {
        bool is_object;
        object::iterator oit, oend;
        simdjson::dom::array::iterator ait, aend;
        size_t index = 0;
    };
    std::vector<Frame> stack;
    std::vector<PathStep> path;  // path[i]: the step that entered stack[i + 1]
    std::unordered_set<std::string_view> seen;
    auto enter = [&](const element& e) {
        if (e.type() == element_type::OBJECT) {
            object o = e.get_object().value_unsafe();
            seen.clear();
            for (auto kv : o)
                if (!seen.insert(kv.key).second) {
                    const std::string top = path.empty() ? sanitize_utf8(kv.key.substr(0, 64))
                                                         : sanitize_utf8(path.front().key.substr(0, 64));
                    throw RequestError(top, fmt::format("duplicate field '{}'", path_text(path, kv.key)));
                }
            stack.push_back(Frame{true, o.begin(), o.end(), {}, {}});
        } else if (e.type() == element_type::ARRAY) {
            simdjson::dom::array a = e.get_array().value_unsafe();
            stack.push_back(Frame{false, {}, {}, a.begin(), a.end()});
        }
    };
    enter(root);
    while (!stack.empty()) {
        Frame& f = stack.back();
        if (stack.size() <= path.size()) path.pop_back();  // back from the child this frame entered last
        element child;
        PathStep step;
        if (f.is_object) {
            if (f.oit == f.oend) {
                stack.pop_back();
                continue;
            }
            auto kv = *f.oit;
            ++f.oit;
            child = kv.value;
            step = PathStep{kv.key, 0, true};
        } else {
            if (f.ait == f.aend) {
                stack.pop_back();
                continue;
            }
            child = *f.ait;
            ++f.ait;
            step = PathStep{{}, f.index++, false};
        }
        if (child.type() != element_type::OBJECT && child.type() != element_type::ARRAY) continue;
        path.push_back(step);
        enter(child);  // may reallocate the stack: `f` is not used after this
    }
}

void reject_unknown(const object& obj, std::initializer_list<std::string_view> allowed) {
    for (auto kv : obj) {
        bool ok = false;
        for (auto a : allowed) ok = ok || a == kv.key;
        if (!ok) {
            std::string printable = sanitize_utf8(kv.key.substr(0, 64));
            throw RequestError(printable, fmt::format("unknown field '{}'", printable));
        }
    }
}

std::optional<element> field(const object& obj, std::string_view key) {
    element e;
    if (obj.at_key(key).get(e)) return std::nullopt;
    if (e.type() == element_type::NULL_VALUE) return std::nullopt;
    return e;
}

static RequestError wrong_type(std::string_view key, const char* want, const element& e) {
    return RequestError(std::string(key), fmt::format("'{}' must be {}, not {}", key, want, type_name(e.type())));
}

std::optional<std::string> get_string(const object& obj, std::string_view key) {
    auto e = field(obj, key);
    if (!e) return std::nullopt;
    if (e->type() != element_type::STRING) throw wrong_type(key, "a string", *e);
    return std::string(e->get_string().value_unsafe());
}

static double as_number(const element& e, std::string_view key) {
    switch (e.type()) {
    case element_type::INT64: return double(e.get_int64().value_unsafe());
    case element_type::UINT64: return double(e.get_uint64().value_unsafe());
    case element_type::DOUBLE: return e.get_double().value_unsafe();
    default: throw wrong_type(key, "a number", e);
    }
}

std::optional<double> get_number(const object& obj, std::string_view key, double lo, double hi, bool lo_open) {
    auto e = field(obj, key);
    if (!e) return std::nullopt;
    double v = as_number(*e, key);
    if (!std::isfinite(v) || v < lo || v > hi || (lo_open && v == lo))
        throw RequestError(std::string(key), fmt::format("'{}' must be in {}{}, {}]; got {}", key, lo_open ? "(" : "[",
                                                         lo, hi, v));
    return v;
}

std::optional<int64_t> get_int(const object& obj, std::string_view key, int64_t lo, int64_t hi) {
    auto e = field(obj, key);
    if (!e) return std::nullopt;
    int64_t v;
    if (e->type() == element_type::INT64) {
        v = e->get_int64().value_unsafe();
    } else if (e->type() == element_type::UINT64) {
        v = INT64_MAX;  // beyond every range we accept
    } else if (e->type() == element_type::DOUBLE) {
        throw RequestError(std::string(key), fmt::format("'{}' must be an integer, not a fraction ({})", key,
                                                         e->get_double().value_unsafe()));
    } else {
        throw wrong_type(key, "an integer", *e);
    }
    if (v < lo || v > hi) {
        std::string got = e->type() == element_type::UINT64 ? std::to_string(e->get_uint64().value_unsafe())
                                                             : std::to_string(v);
        throw RequestError(std::string(key), fmt::format("'{}' must be between {} and {}; got {}", key, lo, hi, got));
    }
    return v;
}

std::optional<uint64_t> get_uint64(const object& obj, std::string_view key) {
    auto e = field(obj, key);
    if (!e) return std::nullopt;
    if (e->type() == element_type::UINT64) return e->get_uint64().value_unsafe();
    if (e->type() == element_type::INT64) {
        int64_t v = e->get_int64().value_unsafe();
        if (v < 0) throw RequestError(std::string(key), fmt::format("'{}' must be a non-negative integer; got {}", key, v));
        return uint64_t(v);
    }
    if (e->type() == element_type::DOUBLE)
        throw RequestError(std::string(key),
                           fmt::format("'{}' must be an integer between 0 and 18446744073709551615", key));
    throw wrong_type(key, "an integer", *e);
}

std::optional<bool> get_bool(const object& obj, std::string_view key) {
    auto e = field(obj, key);
    if (!e) return std::nullopt;
    if (e->type() != element_type::BOOL) throw wrong_type(key, "a boolean", *e);
    return e->get_bool().value_unsafe();
}

std::vector<std::pair<int32_t, float>> get_logit_bias(const object& obj, std::string_view key,
                                                      const RequestLimits& limits) {
    std::vector<std::pair<int32_t, float>> out;
    auto e = field(obj, key);
    if (!e) return out;
    if (e->type() != element_type::OBJECT) throw wrong_type(key, "an object of token id -> bias", *e);
    auto o = e->get_object().value_unsafe();
    if (o.size() > limits.max_logit_bias)
        throw RequestError(std::string(key), fmt::format("'{}' has {} entries; the limit is {}", key, o.size(),
                                                         limits.max_logit_bias));
    for (auto [k, v] : o) {
        const std::string_view id_text = k;
        int64_t id = -1;
        const bool digits = !id_text.empty() && id_text.size() <= 10 &&
                            std::all_of(id_text.begin(), id_text.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (digits) id = std::stoll(std::string(id_text));
        if (!digits || id > INT32_MAX)
            throw RequestError(std::string(key), fmt::format("'{}' keys must be token ids (decimal integers); got '{}'",
                                                             key, sanitize_utf8(std::string(id_text.substr(0, 32)))));
        double b = 0;
        if (v.type() == element_type::INT64) b = double(v.get_int64().value_unsafe());
        else if (v.type() == element_type::UINT64) b = double(v.get_uint64().value_unsafe());
        else if (v.type() == element_type::DOUBLE) b = v.get_double().value_unsafe();
        else throw RequestError(std::string(key), fmt::format("'{}' values must be numbers", key));
        if (!(b >= -100.0 && b <= 100.0))
            throw RequestError(std::string(key), fmt::format("'{}' values must be between -100 and 100; got {}", key, b));
        out.emplace_back(int32_t(id), float(b));
    }
    return out;
}

void get_penalties(const object& obj, Sampling& s, const RequestLimits& limits) {
    if (auto v = get_number(obj, "presence_penalty", -2, 2)) s.presence_penalty = *v;
    if (auto v = get_number(obj, "frequency_penalty", -2, 2)) s.frequency_penalty = *v;
    s.logit_bias = get_logit_bias(obj, "logit_bias", limits);
}

std::vector<std::string> get_stop(const object& obj, std::string_view key, const RequestLimits& limits) {
    auto e = field(obj, key);
    std::vector<std::string> out;
    if (!e) return out;
    auto add = [&](const element& s, size_t i) {
        if (s.type() != element_type::STRING)
            throw RequestError(std::string(key), fmt::format("'{}[{}]' must be a string, not {}", key, i, type_name(s.type())));
        std::string_view v = s.get_string().value_unsafe();
        if (v.empty()) throw RequestError(std::string(key), fmt::format("'{}[{}]' must not be empty", key, i));
        if (v.size() > limits.max_stop_bytes)
            throw RequestError(std::string(key), fmt::format("'{}[{}]' is {} bytes; the limit is {}", key, i, v.size(),
                                                             limits.max_stop_bytes));
        out.emplace_back(v);
    };
    if (e->type() == element_type::STRING) {
        add(*e, 0);
    } else if (e->type() == element_type::ARRAY) {
        size_t i = 0;
        simdjson::dom::array arr_ = e->get_array().value_unsafe();
        for (element s : arr_) {
            if (i >= limits.max_stop)
                throw RequestError(std::string(key), fmt::format("'{}' has more than {} strings", key, limits.max_stop));
            add(s, i++);
        }
    } else {
        throw wrong_type(key, "a string or an array of strings", *e);
    }
    return out;
}

}  // namespace eh::http::json
