// Values of the Jinja subset: Python-like dynamic values with reference
// semantics for lists, dicts and namespaces (a namespace is a dict whose
// attributes `set ns.x = ...` may change).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace eh::tokenizer::jinja {

struct Value;
using Array = std::vector<Value>;
struct Object;
using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;
using Function = std::function<Value(Args&, Kwargs&)>;

struct Value {
    enum class T { Undefined, None, Bool, Int, Float, Str, Arr, Obj, Fn };
    T t = T::Undefined;
    bool b = false;
    int64_t i = 0;
    double f = 0;
    std::string s;
    std::shared_ptr<Array> a;
    std::shared_ptr<Object> o;
    std::shared_ptr<Function> fn;

    Value() = default;
    Value(const Value&) = default;
    Value(Value&&) noexcept = default;
    Value& operator=(const Value&) = default;
    Value& operator=(Value&&) noexcept = default;
    // A list wrapped in a list in a loop nests as deep as the step budget
    // lets it (hundreds of thousands of levels); freeing it level by level
    // through the destructors would overflow the stack, so the last owner
    // of a list or dict frees what it holds iteratively (release()).
    ~Value() {
        if (a || o) release();
    }

    static Value none() { Value v; v.t = T::None; return v; }
    static Value boolean(bool x) { Value v; v.t = T::Bool; v.b = x; return v; }
    static Value integer(int64_t x) { Value v; v.t = T::Int; v.i = x; return v; }
    static Value number(double x) { Value v; v.t = T::Float; v.f = x; return v; }
    static Value str(std::string x) { Value v; v.t = T::Str; v.s = std::move(x); return v; }
    static Value array(Array x = {});
    static Value object();
    static Value function(Function f) { Value v; v.t = T::Fn; v.fn = std::make_shared<Function>(std::move(f)); return v; }

    bool defined() const { return t != T::Undefined; }
    bool is_none() const { return t == T::None || t == T::Undefined; }
    bool numeric() const { return t == T::Int || t == T::Float || t == T::Bool; }
    double as_double() const { return t == T::Float ? f : t == T::Int ? double(i) : t == T::Bool ? double(b) : 0; }
    bool truthy() const;

private:
    void release() noexcept;
};

struct Object {
    std::vector<std::pair<std::string, Value>> items;  // insertion order, as Python dicts
    bool is_namespace = false;
    const Value* find(std::string_view key) const {
        for (const auto& [k, v] : items)
            if (k == key) return &v;
        return nullptr;
    }
    void set(const std::string& key, Value v) {
        for (auto& [k, old] : items)
            if (k == key) { old = std::move(v); return; }
        items.emplace_back(key, std::move(v));
    }
};

// Lists and dicts have reference semantics, so a template can make one hold
// itself (`set ns.x = ns`, `l.append(l)`), and shared ownership alone would
// never free it. While a RenderArena lives on a thread, every list and dict
// made on that thread is recorded; when the arena ends, those still alive
// (only a cycle keeps one alive once the render's own values are gone) are
// emptied, which frees them. One arena per render (template.cpp), declared
// before any value of the render. Not nestable: a second one on the same
// thread throws eh::Error(Internal).
class RenderArena {
public:
    RenderArena();
    ~RenderArena();
    RenderArena(const RenderArena&) = delete;
    RenderArena& operator=(const RenderArena&) = delete;

    void track(const std::shared_ptr<Array>& a);
    void track(const std::shared_ptr<Object>& o);

private:
    // Records of containers already freed are dropped whenever a list
    // doubles past its last compaction, so the records (and the memory a
    // weak reference keeps) stay within twice the containers alive.
    std::vector<std::weak_ptr<Array>> arrays_;
    std::vector<std::weak_ptr<Object>> objects_;
    size_t arrays_compact_at_ = 1024, objects_compact_at_ = 1024;
};

// Lists and dicts nest at most this deep where they are compared, printed or
// written as JSON (deeper, or a namespace that holds itself: InvalidRequest),
// as deep as the JSON parser takes input (simdjson's default, 1024): those
// walks recurse once per level, and a template can build any depth (a list
// wrapped in a list in a loop) within its step budget.
inline constexpr int kMaxValueNesting = 1024;

bool equal(const Value& a, const Value& b);
// What {{ x }} prints: Python str() of the value ("" for undefined).
std::string to_output(const Value& v);
// json.dumps(v, ensure_ascii=False) with Python's default separators.
std::string to_json(const Value& v, int indent = -1, int depth = 0);
// Parses JSON text into a Value (throws eh::Error(InvalidRequest)).
Value from_json(std::string_view json);

}  // namespace eh::tokenizer::jinja
