#include "value.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <simdjson.h>

#include "eh/error.hpp"

namespace eh::tokenizer::jinja {

namespace {
thread_local RenderArena* t_arena = nullptr;
}  // namespace

RenderArena::RenderArena() {
    if (t_arena) throw Error(Code::Internal, "jinja: RenderArena is not nestable");
    t_arena = this;
}

RenderArena::~RenderArena() {
    t_arena = nullptr;
    // Whatever is still alive is held only by a cycle: move every such
    // container's contents out, then let them go (Value's destructor frees
    // nested containers iteratively).
    Array garbage;  // (a bad_alloc here ends the process: noexcept, as any destructor)
    for (auto& w : arrays_)
        if (auto a = w.lock()) {
            for (Value& v : *a) garbage.push_back(std::move(v));
            a->clear();
        }
    for (auto& w : objects_)
        if (auto o = w.lock()) {
            for (auto& kv : o->items) garbage.push_back(std::move(kv.second));
            o->items.clear();
        }
}

namespace {
template <class T>
void track_in(std::vector<std::weak_ptr<T>>& list, size_t& compact_at, const std::shared_ptr<T>& p) {
    list.push_back(p);
    if (list.size() < compact_at) return;
    std::erase_if(list, [](const std::weak_ptr<T>& w) { return w.expired(); });
    compact_at = std::max<size_t>(1024, 2 * list.size());
}
}  // namespace

void RenderArena::track(const std::shared_ptr<Array>& a) { track_in(arrays_, arrays_compact_at_, a); }
void RenderArena::track(const std::shared_ptr<Object>& o) { track_in(objects_, objects_compact_at_, o); }

Value Value::array(Array x) {
    Value v;
    v.t = T::Arr;
    v.a = std::make_shared<Array>(std::move(x));
    if (t_arena) t_arena->track(v.a);
    return v;
}

Value Value::object() {
    Value v;
    v.t = T::Obj;
    v.o = std::make_shared<Object>();
    if (t_arena) t_arena->track(v.o);
    return v;
}

void Value::release() noexcept {
    // Containers this value held the last reference to, emptied one at a
    // time: a child's own containers are moved here before the child is
    // destroyed, so no destructor below recurses more than one level.
    std::vector<std::shared_ptr<Array>> arrays;
    std::vector<std::shared_ptr<Object>> objects;
    auto take = [&](Value& v) {
        if (v.a && v.a.use_count() == 1) arrays.push_back(std::move(v.a));
        if (v.o && v.o.use_count() == 1) objects.push_back(std::move(v.o));
    };
    take(*this);
    while (!arrays.empty() || !objects.empty()) {
        if (!arrays.empty()) {
            std::shared_ptr<Array> arr = std::move(arrays.back());
            arrays.pop_back();
            for (Value& x : *arr) take(x);
        } else {
            std::shared_ptr<Object> obj = std::move(objects.back());
            objects.pop_back();
            for (auto& [k, x] : obj->items) take(x);
        }
    }
    a.reset();  // shared with others: only the count drops
    o.reset();
}

bool Value::truthy() const {
    switch (t) {
        case T::Undefined: case T::None: return false;
        case T::Bool: return b;
        case T::Int: return i != 0;
        case T::Float: return f != 0;
        case T::Str: return !s.empty();
        case T::Arr: return !a->empty();
        case T::Obj: return o->is_namespace || !o->items.empty();
        case T::Fn: return true;
    }
    return false;
}

namespace {

// Each walk below counts its depth with this: past kMaxValueNesting it
// throws instead of overflowing the stack (or looping for ever on a cycle).
void check_nesting(int depth) {
    if (depth > kMaxValueNesting)
        throw Error(Code::InvalidRequest,
                    "chat template: a value nested deeper than " + std::to_string(kMaxValueNesting) + " levels");
}

bool equal_at(const Value& x, const Value& y, int depth) {
    using T = Value::T;
    check_nesting(depth);
    if (x.numeric() && y.numeric()) return x.as_double() == y.as_double();
    if (x.is_none() && y.is_none()) return x.t == y.t;
    if (x.t != y.t) return false;
    switch (x.t) {
        case T::Str: return x.s == y.s;
        case T::Arr:
            if (x.a->size() != y.a->size()) return false;
            for (size_t k = 0; k < x.a->size(); ++k)
                if (!equal_at((*x.a)[k], (*y.a)[k], depth + 1)) return false;
            return true;
        case T::Obj:
            if (x.o->items.size() != y.o->items.size()) return false;
            for (const auto& [k, v] : x.o->items) {
                const Value* w = y.o->find(k);
                if (!w || !equal_at(v, *w, depth + 1)) return false;
            }
            return true;
        case T::Fn: return x.fn == y.fn;
        default: return false;
    }
}

std::string output_at(const Value& v, int depth);

std::string float_repr(double d) {
    if (std::isnan(d)) return "NaN";
    if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, d);
    std::string s(buf, r.ptr);
    if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
    return s;
}

void json_string(std::string& out, std::string_view s) {
    out += '"';
    for (char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            case '\b': out += "\\b"; break;
            case '\f': out += "\\f"; break;
            default:
                if (static_cast<unsigned char>(c) < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned char>(c));
                    out += buf;
                } else {
                    out += c;
                }
        }
    }
    out += '"';
}

// Python repr() of a string: single quotes unless the text holds one.
std::string py_repr_str(const std::string& s) {
    const char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
    std::string out(1, q);
    for (char c : s) {
        if (c == q || c == '\\') { out += '\\'; out += c; }
        else if (c == '\n') out += "\\n";
        else if (c == '\t') out += "\\t";
        else if (c == '\r') out += "\\r";
        else out += c;
    }
    return out + q;
}

std::string py_repr(const Value& v, int depth) {
    if (v.t == Value::T::Str) return py_repr_str(v.s);
    return output_at(v, depth);
}

std::string output_at(const Value& v, int depth) {
    using T = Value::T;
    check_nesting(depth);
    switch (v.t) {
        case T::Undefined: return "";
        case T::None: return "None";
        case T::Bool: return v.b ? "True" : "False";
        case T::Int: return std::to_string(v.i);
        case T::Float: return float_repr(v.f);
        case T::Str: return v.s;
        case T::Arr: {
            std::string s = "[";
            for (size_t k = 0; k < v.a->size(); ++k) s += (k ? ", " : "") + py_repr((*v.a)[k], depth + 1);
            return s + "]";
        }
        case T::Obj: {
            std::string s = "{";
            bool first = true;
            for (const auto& [k, x] : v.o->items) {
                s += (first ? "" : ", ") + py_repr_str(k) + ": " + py_repr(x, depth + 1);
                first = false;
            }
            return s + "}";
        }
        case T::Fn: return "<function>";
    }
    return "";
}

}  // namespace

bool equal(const Value& x, const Value& y) { return equal_at(x, y, 0); }

std::string to_output(const Value& v) { return output_at(v, 0); }

std::string to_json(const Value& v, int indent, int depth) {
    using T = Value::T;
    check_nesting(depth);
    std::string out;
    auto newline = [&](int d) {
        if (indent < 0) return;
        out += '\n';
        out.append(size_t(indent * d), ' ');
    };
    switch (v.t) {
        case T::Undefined: case T::None: return "null";
        case T::Bool: return v.b ? "true" : "false";
        case T::Int: return std::to_string(v.i);
        case T::Float: return float_repr(v.f);
        case T::Str: json_string(out, v.s); return out;
        case T::Arr:
            if (v.a->empty()) return "[]";
            out += '[';
            for (size_t k = 0; k < v.a->size(); ++k) {
                if (k) out += indent < 0 ? ", " : ",";
                newline(depth + 1);
                out += to_json((*v.a)[k], indent, depth + 1);
            }
            newline(depth);
            return out + ']';
        case T::Obj: {
            if (v.o->items.empty()) return "{}";
            out += '{';
            bool first = true;
            for (const auto& [k, x] : v.o->items) {
                if (!first) out += indent < 0 ? ", " : ",";
                first = false;
                newline(depth + 1);
                json_string(out, k);
                out += ": ";
                out += to_json(x, indent, depth + 1);
            }
            newline(depth);
            return out + '}';
        }
        case T::Fn: return "null";
    }
    return "null";
}

namespace {

Value convert(simdjson::dom::element e) {
    using simdjson::dom::element_type;
    switch (e.type()) {
        case element_type::ARRAY: {
            Value v = Value::array();
            for (auto x : e.get_array()) v.a->push_back(convert(x));
            return v;
        }
        case element_type::OBJECT: {
            Value v = Value::object();
            for (auto [k, x] : e.get_object()) v.o->set(std::string(k), convert(x));
            return v;
        }
        case element_type::INT64: return Value::integer(int64_t(e));
        case element_type::UINT64: return Value::number(double(uint64_t(e)));
        case element_type::DOUBLE: return Value::number(double(e));
        case element_type::STRING: return Value::str(std::string(std::string_view(e)));
        case element_type::BOOL: return Value::boolean(bool(e));
        case element_type::NULL_VALUE: return Value::none();
    }
    return Value::none();
}

}  // namespace

Value from_json(std::string_view json) {
    simdjson::dom::parser parser;
    simdjson::dom::element root;
    if (auto err = parser.parse(simdjson::padded_string(json)).get(root))
        throw Error(Code::InvalidRequest, std::string("chat template input: invalid JSON: ") + simdjson::error_message(err));
    return convert(root);
}

}  // namespace eh::tokenizer::jinja
