// A small Jinja2 interpreter for chat templates: lexer (with trim_blocks /
// lstrip_blocks and "-" whitespace control), a recursive-descent parser into
// statement and expression trees, and a tree-walking evaluator with Jinja's
// scoping (for-loop bodies and macros get their own scope; if does not).
#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cmath>
#include <ctime>
#include <map>

#include "eh/error.hpp"
#include "eh/tokenizer/chat_template.hpp"
#include "value.hpp"

namespace eh::tokenizer::jinja {
namespace {

[[noreturn]] void syntax(int line, const std::string& what) {
    throw Error(Code::InvalidRequest, "chat template line " + std::to_string(line) + ": " + what);
}
[[noreturn]] void runtime(const std::string& what) { throw Error(Code::InvalidRequest, "chat template: " + what); }

// Hostile templates must fail, not crash: the parsers recurse once per
// nesting level, so nesting is bounded well below what the stack holds, and
// every string or list a template builds is bounded so that a few doubling
// steps cannot exhaust memory before the step budget notices.
constexpr int kMaxNesting = 200;
constexpr size_t kMaxValueBytes = size_t(8) << 20;
constexpr size_t kMaxListItems = 1'000'000;

std::string checked_size(std::string s) {
    if (s.size() > kMaxValueBytes)
        runtime("a string grew past " + std::to_string(kMaxValueBytes) + " bytes");
    return s;
}
size_t checked_sum(size_t a, size_t b, size_t limit, const char* what) {
    if (a > limit || b > limit - a) runtime(std::string(what) + " grew past " + std::to_string(limit));
    return a + b;
}

// Counts one level of parser recursion; throws past kMaxNesting.
struct NestGuard {
    int& depth;
    NestGuard(int& d, int line) : depth(d) {
        if (++depth > kMaxNesting) {
            --depth;
            throw Error(Code::InvalidRequest, "chat template line " + std::to_string(line) +
                                                  ": nesting deeper than " + std::to_string(kMaxNesting) + " levels");
        }
    }
    ~NestGuard() { --depth; }
};

// ---------------------------------------------------------------- lexer --

struct Segment {
    enum Kind { Text, Var, Block } kind;
    std::string body;
    int line;
};

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

std::vector<Segment> lex(std::string_view src) {
    struct Raw {
        Segment::Kind kind;  // Text, Var, Block; comments are Block with empty body and `comment`
        bool comment = false;
        std::string body;
        size_t begin = 0;    // source offset (texts)
        bool ltrim = false, rtrim = false, lplus = false, rplus = false;
        int line = 1;
    };
    std::vector<Raw> raw;
    size_t i = 0;
    int line = 1;
    auto count_lines = [&](size_t a, size_t b) {
        for (size_t k = a; k < b; ++k) line += src[k] == '\n';
    };
    while (i < src.size()) {
        size_t open = std::string_view::npos;
        for (size_t k = src.find('{', i); k != std::string_view::npos; k = src.find('{', k + 1)) {
            if (k + 1 < src.size() && (src[k + 1] == '{' || src[k + 1] == '%' || src[k + 1] == '#')) { open = k; break; }
        }
        if (open == std::string_view::npos) open = src.size();
        if (open > i) {
            raw.push_back({Segment::Text, false, std::string(src.substr(i, open - i)), i, false, false, false, false, line});
            count_lines(i, open);
        }
        if (open >= src.size()) break;
        const char type = src[open + 1];
        Raw tag{type == '{' ? Segment::Var : Segment::Block, type == '#', {}, open, false, false, false, false, line};
        size_t p = open + 2;
        if (p < src.size() && src[p] == '-') { tag.ltrim = true; ++p; }
        else if (p < src.size() && src[p] == '+') { tag.lplus = true; ++p; }
        const char close = type == '{' ? '}' : type == '%' ? '%' : '#';
        size_t end = std::string_view::npos;
        char quote = 0;
        for (size_t k = p; k + 1 < src.size(); ++k) {
            const char c = src[k];
            if (type != '#') {
                if (quote) {
                    if (c == '\\') { ++k; continue; }
                    if (c == quote) quote = 0;
                    continue;
                }
                if (c == '"' || c == '\'') { quote = c; continue; }
            }
            if (c == close && src[k + 1] == '}') { end = k; break; }
        }
        if (end == std::string_view::npos) syntax(line, "unclosed tag");
        size_t body_end = end;
        if (body_end > p && src[body_end - 1] == '-') { tag.rtrim = true; --body_end; }
        else if (body_end > p && src[body_end - 1] == '+' && type != '{') { tag.rplus = true; --body_end; }
        if (!tag.comment) tag.body = std::string(src.substr(p, body_end - p));
        raw.push_back(std::move(tag));
        count_lines(open, end + 2);
        i = end + 2;
    }

    // Whitespace control, as Jinja with trim_blocks and lstrip_blocks.
    for (size_t k = 0; k < raw.size(); ++k) {
        Raw& t = raw[k];
        if (t.kind == Segment::Text) continue;
        const bool block = t.kind == Segment::Block;
        if (k > 0 && raw[k - 1].kind == Segment::Text) {
            std::string& prev = raw[k - 1].body;
            if (t.ltrim) {
                while (!prev.empty() && is_ws(prev.back())) prev.pop_back();
            } else if (block && !t.lplus) {
                const size_t nl = prev.rfind('\n');
                const size_t from = nl == std::string::npos ? 0 : nl + 1;
                const size_t seg_begin = raw[k - 1].begin;
                const bool line_start = nl != std::string::npos || seg_begin == 0 || src[seg_begin - 1] == '\n';
                if (line_start && prev.find_first_not_of(" \t", from) == std::string::npos) prev.resize(from);
            }
        }
        if (k + 1 < raw.size() && raw[k + 1].kind == Segment::Text) {
            std::string& next = raw[k + 1].body;
            if (t.rtrim) {
                size_t n = 0;
                while (n < next.size() && is_ws(next[n])) ++n;
                next.erase(0, n);
            } else if (block && !t.rplus) {
                if (next.rfind("\r\n", 0) == 0) next.erase(0, 2);
                else if (!next.empty() && next[0] == '\n') next.erase(0, 1);
            }
        }
    }
    std::vector<Segment> out;
    for (auto& r : raw) {
        if (r.comment) continue;
        if (r.kind == Segment::Text && r.body.empty()) continue;
        out.push_back({r.kind, std::move(r.body), r.line});
    }
    return out;
}

// ---------------------------------------------------- expression tokens --

struct Tok {
    enum Kind { End, Name, Str, Int, Float, Op } kind = End;
    std::string text;
    int64_t i = 0;
    double f = 0;
};

std::vector<Tok> tokenize(const std::string& s, int line) {
    std::vector<Tok> out;
    size_t i = 0;
    while (i < s.size()) {
        const char c = s[i];
        if (is_ws(c)) { ++i; continue; }
        if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
            size_t j = i;
            while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
            out.push_back({Tok::Name, s.substr(i, j - i)});
            i = j;
        } else if (std::isdigit(static_cast<unsigned char>(c))) {
            size_t j = i;
            while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
            if (j + 1 < s.size() && s[j] == '.' && std::isdigit(static_cast<unsigned char>(s[j + 1]))) {
                ++j;
                while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
                Tok t{Tok::Float, s.substr(i, j - i)};
                t.f = std::strtod(t.text.c_str(), nullptr);  // overflow is inf, as in Python
                out.push_back(t);
            } else {
                Tok t{Tok::Int, s.substr(i, j - i)};
                auto [end, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), t.i);
                if (ec != std::errc()) syntax(line, "integer literal " + t.text.substr(0, 40) + " does not fit 64 bits");
                out.push_back(t);
            }
            i = j;
        } else if (c == '"' || c == '\'') {
            std::string v;
            size_t j = i + 1;
            for (; j < s.size() && s[j] != c; ++j) {
                if (s[j] != '\\' || j + 1 >= s.size()) { v += s[j]; continue; }
                const char e = s[++j];
                switch (e) {
                    case 'n': v += '\n'; break;
                    case 't': v += '\t'; break;
                    case 'r': v += '\r'; break;
                    case '\\': v += '\\'; break;
                    case '\'': v += '\''; break;
                    case '"': v += '"'; break;
                    default: v += '\\'; v += e;
                }
            }
            if (j >= s.size()) syntax(line, "unterminated string");
            out.push_back({Tok::Str, v});
            i = j + 1;
        } else {
            static const char* two[] = {"==", "!=", "<=", ">=", "//", "**"};
            std::string op(1, c);
            for (const char* t : two)
                if (s.compare(i, 2, t) == 0) op = t;
            if (op.size() == 1 && std::string_view("+-*/%<>()[]{},.:|~=").find(c) == std::string_view::npos)
                syntax(line, std::string("unexpected character '") + c + "'");
            out.push_back({Tok::Op, op});
            i += op.size();
        }
    }
    out.push_back({Tok::End, ""});
    return out;
}

// ------------------------------------------------------------ the trees --

struct Context;
struct Expr {
    virtual ~Expr() = default;
    virtual Value eval(Context& c) const = 0;
    int height = 1;  // levels down to its deepest leaf; at most kMaxNesting (ExprParser::raise)
};
using ExprP = std::unique_ptr<Expr>;

struct Node {
    virtual ~Node() = default;
    virtual void run(Context& c) const = 0;
};
using NodeP = std::unique_ptr<Node>;
using Body = std::vector<NodeP>;

struct Scope {
    std::map<std::string, Value, std::less<>> vars;
};

struct LoopSignal {
    bool brk = false, cont = false;
};

struct Context {
    std::vector<std::shared_ptr<Scope>> scopes;  // innermost last
    std::string* out;
    LoopSignal signal;
    int depth = 0;
    const ChatOptions* options = nullptr;
    uint64_t steps = 0;

    // One unit of work (a statement, a loop iteration, a call). Past the
    // budget the render fails; the cancel hook is polled every 1024 steps.
    void step() {
        if (++steps > options->max_steps)
            runtime("evaluation exceeded " + std::to_string(options->max_steps) + " steps");
        if ((steps & 1023) == 0 && options->cancelled && options->cancelled())
            throw Error(Code::Cancelled, "chat template: rendering cancelled");
    }
    void emit(std::string_view text) {
        if (out->size() + text.size() > options->max_output_bytes)
            runtime("output exceeded " + std::to_string(options->max_output_bytes) + " bytes");
        out->append(text);
    }

    Value lookup(std::string_view name) const {
        for (auto it = scopes.rbegin(); it != scopes.rend(); ++it) {
            auto f = (*it)->vars.find(name);
            if (f != (*it)->vars.end()) return f->second;
        }
        return Value();
    }
    void assign(const std::string& name, Value v) { scopes.back()->vars[name] = std::move(v); }
};

void run_body(const Body& b, Context& c) {
    for (const auto& n : b) {
        c.step();
        n->run(c);
        if (c.signal.brk || c.signal.cont) return;
    }
}

// -------------------------------------------------------- expressions --

struct Literal : Expr {
    Value v;
    explicit Literal(Value x) : v(std::move(x)) {}
    Value eval(Context&) const override { return v; }
};

struct Name : Expr {
    std::string name;
    explicit Name(std::string n) : name(std::move(n)) {}
    Value eval(Context& c) const override { return c.lookup(name); }
};

struct ListLit : Expr {
    std::vector<ExprP> items;
    Value eval(Context& c) const override {
        Value v = Value::array();
        for (const auto& e : items) v.a->push_back(e->eval(c));
        return v;
    }
};

struct DictLit : Expr {
    std::vector<std::pair<ExprP, ExprP>> items;
    Value eval(Context& c) const override {
        Value v = Value::object();
        for (const auto& [k, x] : items) {
            Value key = k->eval(c);
            v.o->set(to_output(key), x->eval(c));
        }
        return v;
    }
};

Value get_item(const Value& obj, const Value& key) {
    if (obj.t == Value::T::Obj) {
        if (const Value* v = obj.o->find(key.t == Value::T::Str ? key.s : to_output(key))) return *v;
        return Value();
    }
    if ((obj.t == Value::T::Arr || obj.t == Value::T::Str) && key.t == Value::T::Int) {
        const int64_t n = obj.t == Value::T::Arr ? int64_t(obj.a->size()) : int64_t(obj.s.size());
        int64_t k = key.i < 0 ? key.i + n : key.i;
        if (k < 0 || k >= n) return Value();
        return obj.t == Value::T::Arr ? (*obj.a)[k] : Value::str(std::string(1, obj.s[k]));
    }
    return Value();
}

struct GetAttr : Expr {
    ExprP obj;
    std::string name;
    Value eval(Context& c) const override { return get_item(obj->eval(c), Value::str(name)); }
};

struct GetItem : Expr {
    ExprP obj, key;
    Value eval(Context& c) const override { return get_item(obj->eval(c), key->eval(c)); }
};

struct Slice : Expr {
    ExprP obj, start, stop, step;
    Value eval(Context& c) const override {
        const Value o = obj->eval(c);
        const bool arr = o.t == Value::T::Arr;
        if (!arr && o.t != Value::T::Str) return Value();
        const int64_t n = arr ? int64_t(o.a->size()) : int64_t(o.s.size());
        const int64_t st = step ? step->eval(c).i : 1;
        if (st == 0) runtime("slice step cannot be zero");
        auto norm = [&](const ExprP& e, int64_t dflt) {
            if (!e) return dflt;
            Value v = e->eval(c);
            if (v.is_none()) return dflt;
            int64_t k = v.i;
            if (k < 0) k += n;
            return st > 0 ? std::clamp<int64_t>(k, 0, n) : std::clamp<int64_t>(k, -1, n - 1);
        };
        const int64_t a = norm(start, st > 0 ? 0 : n - 1), b = norm(stop, st > 0 ? n : -1);
        Value out = arr ? Value::array() : Value::str("");
        for (int64_t k = a; st > 0 ? k < b : k > b; k += st) {
            if (arr) out.a->push_back((*o.a)[k]);
            else out.s += o.s[k];
        }
        return out;
    }
};

struct CondExpr : Expr {
    ExprP cond, yes, no;
    Value eval(Context& c) const override {
        if (cond->eval(c).truthy()) return yes->eval(c);
        return no ? no->eval(c) : Value();
    }
};

struct Unary : Expr {
    char op;
    ExprP e;
    Value eval(Context& c) const override {
        Value v = e->eval(c);
        if (op == '!') return Value::boolean(!v.truthy());
        if (v.t == Value::T::Int) return Value::integer(op == '-' ? -v.i : v.i);
        if (v.numeric()) return Value::number(op == '-' ? -v.as_double() : v.as_double());
        runtime("unary " + std::string(1, op) + " on a non-number");
    }
};

bool contains(const Value& hay, const Value& needle) {
    if (hay.t == Value::T::Str) return needle.t == Value::T::Str && hay.s.find(needle.s) != std::string::npos;
    if (hay.t == Value::T::Arr)
        return std::any_of(hay.a->begin(), hay.a->end(), [&](const Value& x) { return equal(x, needle); });
    if (hay.t == Value::T::Obj) return needle.t == Value::T::Str && hay.o->find(needle.s) != nullptr;
    return false;
}

Value arith(const std::string& op, const Value& l, const Value& r) {
    using T = Value::T;
    if (op == "+" ) {
        if (l.t == T::Str && r.t == T::Str) return Value::str(checked_size(l.s + r.s));
        if (l.t == T::Arr && r.t == T::Arr) {
            checked_sum(l.a->size(), r.a->size(), kMaxListItems, "a list");
            Value v = Value::array(*l.a);
            v.a->insert(v.a->end(), r.a->begin(), r.a->end());
            return v;
        }
    }
    if (op == "*" && l.t == T::Str && r.t == T::Int) {
        // An empty string times 10^12 is empty: never loop over the count.
        if (r.i <= 0 || l.s.empty()) return Value::str("");
        if (uint64_t(r.i) > kMaxValueBytes / l.s.size())
            runtime("a string grew past " + std::to_string(kMaxValueBytes) + " bytes");
        std::string s;
        s.reserve(l.s.size() * size_t(r.i));
        for (int64_t k = 0; k < r.i; ++k) s += l.s;
        return Value::str(s);
    }
    if (!l.numeric() || !r.numeric())
        runtime("cannot apply '" + op + "' to " + (l.defined() ? to_output(l) : "undefined") + " and " +
                (r.defined() ? to_output(r) : "undefined"));
    const bool ints = l.t != T::Float && r.t != T::Float;
    const double a = l.as_double(), b = r.as_double();
    if (op == "/") { if (b == 0) runtime("division by zero"); return Value::number(a / b); }
    if (ints) {
        const int64_t x = l.t == T::Bool ? l.b : l.i, y = r.t == T::Bool ? r.b : r.i;
        // Python's integers do not overflow; ours are 64-bit: past that the
        // template fails clearly instead of wrapping (undefined behaviour).
        int64_t v = 0;
        if (op == "+" || op == "-" || op == "*") {
            const bool over = op == "+"   ? __builtin_add_overflow(x, y, &v)
                              : op == "-" ? __builtin_sub_overflow(x, y, &v)
                                          : __builtin_mul_overflow(x, y, &v);
            if (over) runtime("integer overflow in '" + op + "'");
            return Value::integer(v);
        }
        if (y == 0) runtime("division by zero");
        if (y == -1 && x == INT64_MIN) runtime("integer overflow");  // would trap (SIGFPE)
        if (op == "//") return Value::integer(x / y - ((x % y != 0) && ((x < 0) != (y < 0))));
        if (op == "%") { int64_t m = x % y; if (m != 0 && ((m < 0) != (y < 0))) m += y; return Value::integer(m); }
    }
    if (op == "+") return Value::number(a + b);
    if (op == "-") return Value::number(a - b);
    if (op == "*") return Value::number(a * b);
    if (b == 0) runtime("division by zero");
    if (op == "//") return Value::number(std::floor(a / b));
    if (op == "%") return Value::number(a - b * std::floor(a / b));
    if (op == "**") return Value::number(std::pow(a, b));
    runtime("unknown operator " + op);
}

int compare(const Value& l, const Value& r) {
    if (l.numeric() && r.numeric()) return l.as_double() < r.as_double() ? -1 : l.as_double() > r.as_double();
    if (l.t == Value::T::Str && r.t == Value::T::Str) return l.s.compare(r.s) < 0 ? -1 : l.s.compare(r.s) > 0;
    runtime("cannot order " + to_output(l) + " and " + to_output(r));
}

struct Binary : Expr {
    std::string op;
    ExprP l, r;
    Value eval(Context& c) const override {
        if (op == "and") { Value a = l->eval(c); return a.truthy() ? r->eval(c) : a; }
        if (op == "or") { Value a = l->eval(c); return a.truthy() ? a : r->eval(c); }
        const Value a = l->eval(c), b = r->eval(c);
        if (op == "==") return Value::boolean(equal(a, b));
        if (op == "!=") return Value::boolean(!equal(a, b));
        if (op == "in") return Value::boolean(contains(b, a));
        if (op == "not in") return Value::boolean(!contains(b, a));
        if (op == "<") return Value::boolean(compare(a, b) < 0);
        if (op == ">") return Value::boolean(compare(a, b) > 0);
        if (op == "<=") return Value::boolean(compare(a, b) <= 0);
        if (op == ">=") return Value::boolean(compare(a, b) >= 0);
        if (op == "~") return Value::str(checked_size(to_output(a) + to_output(b)));
        return arith(op, a, b);
    }
};

struct CallArgs {
    std::vector<ExprP> args;
    std::vector<std::pair<std::string, ExprP>> kwargs;
    void eval(Context& c, Args& a, Kwargs& k) const {
        for (const auto& e : args) a.push_back(e->eval(c));
        for (const auto& [n, e] : kwargs) k.emplace_back(n, e->eval(c));
    }
};

Value kwarg(const Args& a, const Kwargs& k, size_t pos, std::string_view name, Value dflt = Value()) {
    for (const auto& [n, v] : k)
        if (n == name) return v;
    return pos < a.size() ? a[pos] : dflt;
}

std::string strip(const std::string& s, const std::string& chars, bool left, bool right) {
    size_t b = 0, e = s.size();
    if (left) while (b < e && chars.find(s[b]) != std::string::npos) ++b;
    if (right) while (e > b && chars.find(s[e - 1]) != std::string::npos) --e;
    return s.substr(b, e - b);
}

const std::string kWs = " \t\n\r\v\f";

Value items_of(const Value& v) {
    Value out = Value::array();
    if (v.t == Value::T::Obj)
        for (const auto& [k, x] : v.o->items) out.a->push_back(Value::array({Value::str(k), x}));
    return out;
}

// Methods of str and dict that chat templates call.
Value call_method(const Value& self, const std::string& name, Args& a, Kwargs& k) {
    using T = Value::T;
    if (self.t == T::Obj) {
        if (name == "items") return items_of(self);
        if (name == "keys" || name == "values") {
            Value out = Value::array();
            for (const auto& [key, x] : self.o->items) out.a->push_back(name == "keys" ? Value::str(key) : x);
            return out;
        }
        if (name == "get") {
            const Value* v = a.empty() ? nullptr : self.o->find(to_output(a[0]));
            return v ? *v : kwarg(a, k, 1, "default", Value::none());
        }
    }
    if (self.t == T::Str) {
        const std::string& s = self.s;
        auto chars = [&](size_t pos) { Value c = kwarg(a, k, pos, "chars"); return c.t == T::Str ? c.s : kWs; };
        if (name == "strip") return Value::str(strip(s, chars(0), true, true));
        if (name == "lstrip") return Value::str(strip(s, chars(0), true, false));
        if (name == "rstrip") return Value::str(strip(s, chars(0), false, true));
        if (name == "upper" || name == "lower") {
            std::string r = s;
            for (char& ch : r) ch = char(name == "upper" ? std::toupper((unsigned char)ch) : std::tolower((unsigned char)ch));
            return Value::str(r);
        }
        if (name == "startswith" || name == "endswith") {
            const std::string x = a.empty() ? "" : a[0].s;
            const bool ok = name == "startswith" ? s.rfind(x, 0) == 0
                                                 : s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
            return Value::boolean(ok);
        }
        if (name == "replace" && a.size() >= 2) {
            std::string r;
            const std::string& from = a[0].s;
            size_t i = 0;
            if (from.empty()) return Value::str(s);
            for (size_t j; (j = s.find(from, i)) != std::string::npos; i = j + from.size()) {
                r += s.substr(i, j - i) + a[1].s;
                if (r.size() > kMaxValueBytes) checked_size(std::move(r));
            }
            return Value::str(checked_size(r + s.substr(i)));
        }
        if (name == "split") {
            Value out = Value::array();
            const Value sep = kwarg(a, k, 0, "sep");
            if (sep.t != T::Str) {
                size_t i = 0;
                while (i < s.size()) {
                    while (i < s.size() && is_ws(s[i])) ++i;
                    size_t j = i;
                    while (j < s.size() && !is_ws(s[j])) ++j;
                    if (j > i) out.a->push_back(Value::str(s.substr(i, j - i)));
                    i = j;
                }
                return out;
            }
            size_t i = 0;
            for (size_t j; (j = s.find(sep.s, i)) != std::string::npos && !sep.s.empty(); i = j + sep.s.size())
                out.a->push_back(Value::str(s.substr(i, j - i)));
            out.a->push_back(Value::str(s.substr(i)));
            return out;
        }
    }
    runtime("unknown method '" + name + "'");
}

struct Call : Expr {
    ExprP callee;
    CallArgs args;
    Value eval(Context& c) const override {
        c.step();
        Args a;
        Kwargs k;
        if (auto* attr = dynamic_cast<const GetAttr*>(callee.get())) {
            const Value self = attr->obj->eval(c);
            const Value member = get_item(self, Value::str(attr->name));
            if (member.t != Value::T::Fn) {
                args.eval(c, a, k);
                return call_method(self, attr->name, a, k);
            }
        }
        const Value f = callee->eval(c);
        if (f.t != Value::T::Fn) {
            auto* n = dynamic_cast<const Name*>(callee.get());
            runtime("'" + (n ? n->name : std::string("expression")) + "' is not callable");
        }
        args.eval(c, a, k);
        return (*f.fn)(a, k);
    }
};

Value apply_filter(const std::string& name, const Value& v, Args& a, Kwargs& k) {
    using T = Value::T;
    if (name == "tojson") {
        const Value ind = kwarg(a, k, 0, "indent");
        return Value::str(to_json(v, ind.t == T::Int ? int(ind.i) : -1));
    }
    if (name == "length" || name == "count") {
        if (v.t == T::Str) {
            int64_t n = 0;  // characters, not bytes
            for (char ch : v.s) n += (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
            return Value::integer(n);
        }
        if (v.t == T::Arr) return Value::integer(int64_t(v.a->size()));
        if (v.t == T::Obj) return Value::integer(int64_t(v.o->items.size()));
        return Value::integer(0);
    }
    if (name == "join") {
        const Value sep = kwarg(a, k, 0, "d", Value::str(""));
        std::string out;
        if (v.t == T::Arr)
            for (size_t i = 0; i < v.a->size(); ++i) {
                out += (i ? sep.s : "") + to_output((*v.a)[i]);
                if (out.size() > kMaxValueBytes) checked_size(std::move(out));
            }
        return Value::str(out);
    }
    if (name == "trim") return Value::str(strip(to_output(v), kWs, true, true));
    if (name == "lower" || name == "upper") {
        Args none;
        Kwargs nk;
        return call_method(Value::str(to_output(v)), name, none, nk);
    }
    if (name == "string") return Value::str(to_output(v));
    if (name == "safe" || name == "e" || name == "escape") return v;  // autoescape is off for chat templates
    if (name == "default" || name == "d") {
        const bool boolean = kwarg(a, k, 1, "boolean", Value::boolean(false)).truthy();
        return (boolean ? v.truthy() : v.defined()) ? v : kwarg(a, k, 0, "default_value", Value::str(""));
    }
    if (name == "first") return v.t == T::Arr && !v.a->empty() ? v.a->front() : Value();
    if (name == "last") return v.t == T::Arr && !v.a->empty() ? v.a->back() : Value();
    if (name == "list") {
        if (v.t == T::Arr) return v;
        Value out = Value::array();
        if (v.t == T::Obj) for (const auto& [key, x] : v.o->items) out.a->push_back(Value::str(key));
        if (v.t == T::Str) for (char ch : v.s) out.a->push_back(Value::str(std::string(1, ch)));
        return out;
    }
    if (name == "items") return items_of(v);
    if (name == "int") return Value::integer(v.t == T::Str ? std::atoll(v.s.c_str()) : int64_t(v.as_double()));
    if (name == "replace") return call_method(Value::str(to_output(v)), "replace", a, k);
    if (name == "capitalize") {
        std::string s = to_output(v);
        for (size_t i = 0; i < s.size(); ++i) s[i] = char(i ? std::tolower((unsigned char)s[i]) : std::toupper((unsigned char)s[i]));
        return Value::str(s);
    }
    runtime("unknown filter '" + name + "'");
}

struct Filter : Expr {
    ExprP e;
    std::string name;
    CallArgs args;
    Value eval(Context& c) const override {
        const Value v = e->eval(c);
        Args a;
        Kwargs k;
        args.eval(c, a, k);
        return apply_filter(name, v, a, k);
    }
};

struct Test : Expr {
    ExprP e;
    std::string name;
    bool negate = false;
    CallArgs args;
    Value eval(Context& c) const override {
        using T = Value::T;
        const Value v = e->eval(c);
        bool r;
        if (name == "defined") r = v.defined();
        else if (name == "undefined") r = !v.defined();
        else if (name == "none") r = v.t == T::None;
        else if (name == "string") r = v.t == T::Str;
        else if (name == "mapping") r = v.t == T::Obj;
        else if (name == "iterable") r = v.t == T::Arr || v.t == T::Str || v.t == T::Obj;
        else if (name == "sequence") r = v.t == T::Arr || v.t == T::Str;
        else if (name == "number") r = v.t == T::Int || v.t == T::Float;
        else if (name == "integer") r = v.t == T::Int;
        else if (name == "boolean") r = v.t == T::Bool;
        else if (name == "true") r = v.t == T::Bool && v.b;
        else if (name == "false") r = v.t == T::Bool && !v.b;
        else if (name == "callable") r = v.t == T::Fn;
        else if (name == "even" || name == "odd") r = v.t == T::Int && (v.i % 2 == 0) == (name == "even");
        else if (name == "equalto" || name == "eq" || name == "sameas") {
            Args a;
            Kwargs k;
            args.eval(c, a, k);
            r = !a.empty() && equal(v, a[0]);
        } else runtime("unknown test '" + name + "'");
        return Value::boolean(r != negate);
    }
};

// ---------------------------------------------------------- statements --

struct TextNode : Node {
    std::string text;
    void run(Context& c) const override { c.emit(text); }
};

struct OutputNode : Node {
    ExprP e;
    void run(Context& c) const override { c.emit(to_output(e->eval(c))); }
};

struct IfNode : Node {
    std::vector<std::pair<ExprP, Body>> branches;  // a null condition is "else"
    void run(Context& c) const override {
        for (const auto& [cond, body] : branches)
            if (!cond || cond->eval(c).truthy()) { run_body(body, c); return; }
    }
};

struct ForNode : Node {
    std::vector<std::string> vars;
    ExprP iter, filter;
    Body body, else_body;
    void run(Context& c) const override {
        Value seq = iter->eval(c);
        std::vector<Value> items;
        if (seq.t == Value::T::Arr) items = *seq.a;
        else if (seq.t == Value::T::Obj) for (const auto& [k, v] : seq.o->items) items.push_back(Value::str(k));
        else if (seq.t == Value::T::Str) for (char ch : seq.s) items.push_back(Value::str(std::string(1, ch)));
        else if (seq.defined() && !seq.is_none()) runtime("cannot loop over " + to_output(seq));

        auto scope = std::make_shared<Scope>();
        c.scopes.push_back(scope);
        auto bind = [&](const Value& item) {
            if (vars.size() == 1) { scope->vars[vars[0]] = item; return; }
            for (size_t k = 0; k < vars.size(); ++k)
                scope->vars[vars[k]] = item.t == Value::T::Arr && k < item.a->size() ? (*item.a)[k] : Value();
        };
        if (filter) {
            std::vector<Value> kept;
            for (const auto& it : items) {
                c.step();
                bind(it);
                if (filter->eval(c).truthy()) kept.push_back(it);
            }
            items.swap(kept);
        }
        const int64_t n = int64_t(items.size());
        for (int64_t k = 0; k < n; ++k) {
            c.step();
            scope->vars.clear();
            bind(items[k]);
            Value loop = Value::object();
            loop.o->set("index", Value::integer(k + 1));
            loop.o->set("index0", Value::integer(k));
            loop.o->set("revindex", Value::integer(n - k));
            loop.o->set("revindex0", Value::integer(n - k - 1));
            loop.o->set("first", Value::boolean(k == 0));
            loop.o->set("last", Value::boolean(k == n - 1));
            loop.o->set("length", Value::integer(n));
            loop.o->set("previtem", k > 0 ? items[k - 1] : Value());
            loop.o->set("nextitem", k + 1 < n ? items[k + 1] : Value());
            scope->vars["loop"] = loop;
            run_body(body, c);
            c.signal.cont = false;
            if (c.signal.brk) { c.signal.brk = false; break; }
        }
        c.scopes.pop_back();
        if (n == 0) run_body(else_body, c);
    }
};

struct SetNode : Node {
    std::string name, attr;  // attr set: `set ns.attr = ...`
    ExprP e;
    Body block;              // `{% set x %}...{% endset %}`
    void run(Context& c) const override {
        Value v;
        if (e) {
            v = e->eval(c);
        } else {
            std::string buf;
            std::string* saved = c.out;
            c.out = &buf;
            run_body(block, c);
            c.out = saved;
            v = Value::str(buf);
        }
        if (attr.empty()) { c.assign(name, v); return; }
        Value ns = c.lookup(name);
        if (ns.t != Value::T::Obj || !ns.o->is_namespace) runtime("cannot set attribute on '" + name + "' (not a namespace)");
        ns.o->set(attr, v);
    }
};

struct SignalNode : Node {
    bool brk;
    explicit SignalNode(bool b) : brk(b) {}
    void run(Context& c) const override { (brk ? c.signal.brk : c.signal.cont) = true; }
};

struct MacroNode : Node {
    std::string name;
    std::vector<std::string> params;
    std::vector<ExprP> defaults;  // per param, may be null
    Body body;
    void run(Context& c) const override {
        const MacroNode* self = this;
        // Weak: the macro lives in a scope the globals hold, and a strong
        // capture would keep the globals (messages included) alive for
        // ever. The render owns the globals for as long as it can call it.
        std::weak_ptr<Scope> weak_globals = c.scopes.front();
        Context* ctx = &c;
        c.assign(name, Value::function([self, weak_globals, ctx](Args& a, Kwargs& k) -> Value {
            const std::shared_ptr<Scope> globals = weak_globals.lock();
            if (!globals) runtime("macro called after its template's render");
            Context& c2 = *ctx;
            if (++c2.depth > 200) runtime("macro recursion too deep");
            auto scope = std::make_shared<Scope>();
            for (size_t i = 0; i < self->params.size(); ++i) {
                Value v = kwarg(a, k, i, self->params[i]);
                if (!v.defined() && self->defaults[i]) v = self->defaults[i]->eval(c2);
                scope->vars[self->params[i]] = v;
            }
            auto saved_scopes = std::move(c2.scopes);
            c2.scopes = {globals, scope};
            std::string buf;
            std::string* saved_out = c2.out;
            c2.out = &buf;
            try {
                run_body(self->body, c2);
            } catch (...) {
                c2.out = saved_out;
                c2.scopes = std::move(saved_scopes);
                --c2.depth;
                throw;
            }
            c2.out = saved_out;
            c2.scopes = std::move(saved_scopes);
            --c2.depth;
            return Value::str(buf);
        }));
    }
};

// -------------------------------------------------------------- parser --

class ExprParser {
public:
    ExprParser(const std::string& src, int line) : toks_(tokenize(src, line)), line_(line) {}

    ExprP parse_expression() { return parse_cond(); }
    bool at_end() const { return toks_[pos_].kind == Tok::End; }
    bool peek_name(std::string_view n) const { return toks_[pos_].kind == Tok::Name && toks_[pos_].text == n; }
    bool peek_op(std::string_view o) const { return toks_[pos_].kind == Tok::Op && toks_[pos_].text == o; }
    std::string name() {
        if (toks_[pos_].kind != Tok::Name) fail("expected a name");
        return toks_[pos_++].text;
    }
    void expect_op(std::string_view o) {
        if (!peek_op(o)) fail("expected '" + std::string(o) + "'");
        ++pos_;
    }
    bool accept_op(std::string_view o) { if (peek_op(o)) { ++pos_; return true; } return false; }
    bool accept_name(std::string_view n) { if (peek_name(n)) { ++pos_; return true; } return false; }
    void expect_end() { if (!at_end()) fail("unexpected '" + toks_[pos_].text + "'"); }
    [[noreturn]] void fail(const std::string& what) const { syntax(line_, what); }

    ExprP parse_cond() {
        NestGuard g(depth_, line_);
        ExprP e = parse_or();
        while (peek_name("if")) {
            ++pos_;
            auto c = std::make_unique<CondExpr>();
            c->cond = parse_or();
            if (accept_name("else")) c->no = parse_cond();
            c->yes = std::move(e);
            raise(*c, std::max({height(c->cond), height(c->yes), height(c->no)}));
            e = std::move(c);
        }
        return e;
    }

    // The condition of a for-loop filter: no inline "if" there.
    ExprP parse_or() {
        ExprP e = parse_and();
        while (accept_name("or")) e = binary("or", std::move(e), parse_and());
        return e;
    }

private:
    ExprP binary(std::string op, ExprP l, ExprP r) {
        auto b = std::make_unique<Binary>();
        b->op = std::move(op);
        b->l = std::move(l);
        b->r = std::move(r);
        raise(*b, std::max(height(b->l), height(b->r)));
        return b;
    }
    // The tree's height, not only the parser's recursion, is bounded: loops
    // build left-leaning chains (1+1+1..., x.a.a..., x|f|f..., x()()()...)
    // that are as deep as they are long, and evaluating or destroying a
    // tree recurses once per level. Called on each node with children,
    // while the node is built, so no deeper tree ever exists.
    void raise(Expr& node, int below) const {
        node.height = below + 1;
        if (node.height > kMaxNesting)
            syntax(line_, "nesting deeper than " + std::to_string(kMaxNesting) + " levels");
    }
    static int height(const ExprP& e) { return e ? e->height : 0; }
    static int items_height(const std::vector<ExprP>& items) {
        int h = 0;
        for (const auto& e : items) h = std::max(h, height(e));
        return h;
    }
    static int height(const CallArgs& a) {
        int h = 0;
        for (const auto& e : a.args) h = std::max(h, height(e));
        for (const auto& [k, e] : a.kwargs) h = std::max(h, height(e));
        return h;
    }
    ExprP parse_and() {
        ExprP e = parse_not();
        while (accept_name("and")) e = binary("and", std::move(e), parse_not());
        return e;
    }
    ExprP parse_not() {
        if (accept_name("not")) {
            NestGuard g(depth_, line_);
            auto u = std::make_unique<Unary>();
            u->op = '!';
            u->e = parse_not();
            raise(*u, height(u->e));
            return u;
        }
        return parse_compare();
    }
    ExprP parse_compare() {
        ExprP e = parse_concat();
        while (true) {
            static const char* ops[] = {"==", "!=", "<", ">", "<=", ">="};
            bool matched = false;
            for (const char* o : ops)
                if (peek_op(o)) { ++pos_; e = binary(o, std::move(e), parse_concat()); matched = true; break; }
            if (matched) continue;
            if (accept_name("in")) { e = binary("in", std::move(e), parse_concat()); continue; }
            if (peek_name("not") && toks_[pos_ + 1].kind == Tok::Name && toks_[pos_ + 1].text == "in") {
                pos_ += 2;
                e = binary("not in", std::move(e), parse_concat());
                continue;
            }
            return e;
        }
    }
    ExprP parse_concat() {
        ExprP e = parse_add();
        while (accept_op("~")) e = binary("~", std::move(e), parse_add());
        return e;
    }
    ExprP parse_add() {
        ExprP e = parse_mul();
        while (peek_op("+") || peek_op("-")) {
            std::string op = toks_[pos_++].text;
            e = binary(op, std::move(e), parse_mul());
        }
        return e;
    }
    ExprP parse_mul() {
        ExprP e = parse_unary();
        while (peek_op("*") || peek_op("/") || peek_op("//") || peek_op("%")) {
            std::string op = toks_[pos_++].text;
            e = binary(op, std::move(e), parse_unary());
        }
        return e;
    }
    ExprP parse_unary() {
        if (peek_op("-") || peek_op("+")) {
            NestGuard g(depth_, line_);
            auto u = std::make_unique<Unary>();
            u->op = toks_[pos_++].text[0];
            u->e = parse_unary();
            raise(*u, height(u->e));
            return u;
        }
        ExprP e = parse_pow();
        return parse_filters(std::move(e));
    }
    ExprP parse_pow() {
        ExprP e = parse_postfix(parse_primary());
        if (accept_op("**")) {
            NestGuard g(depth_, line_);
            e = binary("**", std::move(e), parse_unary());
        }
        return e;
    }
    // Filters and tests bind to the operand before them, as in Jinja.
    ExprP parse_filters(ExprP e) {
        while (true) {
            if (accept_op("|")) {
                auto f = std::make_unique<Filter>();
                f->name = name();
                if (accept_op("(")) parse_args(f->args);
                f->e = std::move(e);
                raise(*f, std::max(height(f->e), height(f->args)));
                e = parse_postfix(std::move(f));
            } else if (accept_name("is")) {
                auto t = std::make_unique<Test>();
                t->negate = accept_name("not");
                t->name = name();
                if (accept_op("(")) parse_args(t->args);
                else if (!at_end() && (toks_[pos_].kind == Tok::Str || toks_[pos_].kind == Tok::Int)) {
                    t->args.args.push_back(parse_primary());
                }
                t->e = std::move(e);
                raise(*t, std::max(height(t->e), height(t->args)));
                e = std::move(t);
            } else {
                return e;
            }
        }
    }
    void parse_args(CallArgs& out) {
        if (accept_op(")")) return;
        do {
            if (toks_[pos_].kind == Tok::Name && toks_[pos_ + 1].kind == Tok::Op && toks_[pos_ + 1].text == "=") {
                std::string n = toks_[pos_].text;
                pos_ += 2;
                out.kwargs.emplace_back(n, parse_expression());
            } else {
                out.args.push_back(parse_expression());
            }
        } while (accept_op(","));
        expect_op(")");
    }
    ExprP parse_postfix(ExprP e) {
        while (true) {
            if (accept_op(".")) {
                auto g = std::make_unique<GetAttr>();
                g->obj = std::move(e);
                if (toks_[pos_].kind == Tok::Int) g->name = toks_[pos_++].text;
                else g->name = name();
                raise(*g, height(g->obj));
                e = std::move(g);
            } else if (accept_op("[")) {
                ExprP a, b, s;
                bool slice = false;
                if (!peek_op(":")) a = parse_expression();
                if (accept_op(":")) {
                    slice = true;
                    if (!peek_op("]") && !peek_op(":")) b = parse_expression();
                    if (accept_op(":") && !peek_op("]")) s = parse_expression();
                }
                expect_op("]");
                if (slice) {
                    auto sl = std::make_unique<Slice>();
                    sl->obj = std::move(e);
                    sl->start = std::move(a);
                    sl->stop = std::move(b);
                    sl->step = std::move(s);
                    raise(*sl, std::max({height(sl->obj), height(sl->start), height(sl->stop), height(sl->step)}));
                    e = std::move(sl);
                } else {
                    auto g = std::make_unique<GetItem>();
                    g->obj = std::move(e);
                    g->key = std::move(a);
                    raise(*g, std::max(height(g->obj), height(g->key)));
                    e = std::move(g);
                }
            } else if (accept_op("(")) {
                auto c = std::make_unique<Call>();
                c->callee = std::move(e);
                parse_args(c->args);
                raise(*c, std::max(height(c->callee), height(c->args)));
                e = std::move(c);
            } else {
                return e;
            }
        }
    }
    ExprP parse_primary() {
        const Tok& t = toks_[pos_];
        switch (t.kind) {
            case Tok::Str: {
                ++pos_;
                std::string s = t.text;
                while (toks_[pos_].kind == Tok::Str) s += toks_[pos_++].text;  // adjacent literals join
                return std::make_unique<Literal>(Value::str(s));
            }
            case Tok::Int: ++pos_; return std::make_unique<Literal>(Value::integer(t.i));
            case Tok::Float: ++pos_; return std::make_unique<Literal>(Value::number(t.f));
            case Tok::Name: {
                ++pos_;
                if (t.text == "true" || t.text == "True") return std::make_unique<Literal>(Value::boolean(true));
                if (t.text == "false" || t.text == "False") return std::make_unique<Literal>(Value::boolean(false));
                if (t.text == "none" || t.text == "None") return std::make_unique<Literal>(Value::none());
                return std::make_unique<Name>(t.text);
            }
            case Tok::Op:
                if (t.text == "(") {
                    ++pos_;
                    if (accept_op(")")) return std::make_unique<ListLit>();
                    ExprP e = parse_expression();
                    if (peek_op(",")) {  // a tuple: treated as a list
                        auto l = std::make_unique<ListLit>();
                        l->items.push_back(std::move(e));
                        while (accept_op(",")) {
                            if (peek_op(")")) break;
                            l->items.push_back(parse_expression());
                        }
                        raise(*l, items_height(l->items));
                        e = std::move(l);
                    }
                    expect_op(")");
                    return e;
                }
                if (t.text == "[") {
                    ++pos_;
                    auto l = std::make_unique<ListLit>();
                    if (!accept_op("]")) {
                        do {
                            if (peek_op("]")) break;
                            l->items.push_back(parse_expression());
                        } while (accept_op(","));
                        expect_op("]");
                    }
                    raise(*l, items_height(l->items));
                    return l;
                }
                if (t.text == "{") {
                    ++pos_;
                    auto d = std::make_unique<DictLit>();
                    if (!accept_op("}")) {
                        do {
                            if (peek_op("}")) break;
                            ExprP k = parse_expression();
                            expect_op(":");
                            d->items.emplace_back(std::move(k), parse_expression());
                        } while (accept_op(","));
                        expect_op("}");
                    }
                    int h = 0;
                    for (const auto& [k, v] : d->items) h = std::max({h, height(k), height(v)});
                    raise(*d, h);
                    return d;
                }
                break;
            case Tok::End: break;
        }
        fail(t.kind == Tok::End ? "unexpected end of expression" : "unexpected '" + t.text + "'");
    }

    std::vector<Tok> toks_;
    size_t pos_ = 0;
    int line_;
    int depth_ = 0;  // nesting: brackets and calls (parse_cond), chained not, unary signs, **
};

class Parser {
public:
    explicit Parser(std::vector<Segment> segs) : segs_(std::move(segs)) {}

    Body parse_all() {
        std::string end;
        Body b = parse_body({}, end);
        return b;
    }

private:
    // Parses until a block whose first word is in `enders`; that word goes to `end`.
    Body parse_body(const std::vector<std::string>& enders, std::string& end, ExprParser** end_parser = nullptr) {
        NestGuard g(depth_, pos_ < segs_.size() ? segs_[pos_].line : 0);
        Body body;
        while (pos_ < segs_.size()) {
            const Segment& s = segs_[pos_++];
            if (s.kind == Segment::Text) {
                auto t = std::make_unique<TextNode>();
                t->text = s.body;
                body.push_back(std::move(t));
                continue;
            }
            if (s.kind == Segment::Var) {
                ExprParser p(s.body, s.line);
                auto o = std::make_unique<OutputNode>();
                o->e = p.parse_expression();
                p.expect_end();
                body.push_back(std::move(o));
                continue;
            }
            auto p = std::make_unique<ExprParser>(s.body, s.line);
            const std::string word = p->name();
            if (std::find(enders.begin(), enders.end(), word) != enders.end()) {
                end = word;
                if (end_parser) *end_parser = p.release();
                else p->expect_end();
                return body;
            }
            body.push_back(statement(word, *p, s.line));
        }
        if (!enders.empty()) syntax(segs_.empty() ? 0 : segs_.back().line, "missing {% " + enders.back() + " %}");
        return body;
    }

    NodeP statement(const std::string& word, ExprParser& p, int line) {
        if (word == "if") {
            auto n = std::make_unique<IfNode>();
            ExprP cond = p.parse_expression();
            p.expect_end();
            while (true) {
                std::string end;
                ExprParser* ep = nullptr;
                Body b = parse_body({"elif", "else", "endif"}, end, &ep);
                std::unique_ptr<ExprParser> owned(ep);
                n->branches.emplace_back(std::move(cond), std::move(b));
                if (end == "endif") { owned->expect_end(); break; }
                if (end == "else") {
                    owned->expect_end();
                    std::string end2;
                    Body eb = parse_body({"endif"}, end2);
                    n->branches.emplace_back(nullptr, std::move(eb));
                    break;
                }
                cond = owned->parse_expression();
                owned->expect_end();
            }
            return n;
        }
        if (word == "for") {
            auto n = std::make_unique<ForNode>();
            do n->vars.push_back(p.name()); while (p.accept_op(","));
            if (!p.accept_name("in")) p.fail("expected 'in'");
            n->iter = p.parse_or();
            if (p.accept_name("if")) n->filter = p.parse_or();
            p.accept_name("recursive");
            p.expect_end();
            std::string end;
            n->body = parse_body({"else", "endfor"}, end);
            if (end == "else") {
                std::string end2;
                n->else_body = parse_body({"endfor"}, end2);
            }
            return n;
        }
        if (word == "set") {
            auto n = std::make_unique<SetNode>();
            n->name = p.name();
            if (p.accept_op(".")) n->attr = p.name();
            if (p.accept_op("=")) {
                n->e = p.parse_expression();
                p.expect_end();
            } else {
                p.expect_end();
                std::string end;
                n->block = parse_body({"endset"}, end);
            }
            return n;
        }
        if (word == "macro") {
            auto n = std::make_unique<MacroNode>();
            n->name = p.name();
            p.expect_op("(");
            if (!p.accept_op(")")) {
                do {
                    n->params.push_back(p.name());
                    n->defaults.push_back(p.accept_op("=") ? p.parse_expression() : nullptr);
                } while (p.accept_op(","));
                p.expect_op(")");
            }
            p.expect_end();
            std::string end;
            n->body = parse_body({"endmacro"}, end);
            return n;
        }
        if (word == "break" || word == "continue") {
            p.expect_end();
            return std::make_unique<SignalNode>(word == "break");
        }
        if (word == "generation") {  // transformers' assistant-mask marker: renders its body
            p.expect_end();
            std::string end;
            auto n = std::make_unique<IfNode>();
            n->branches.emplace_back(nullptr, parse_body({"endgeneration"}, end));
            return n;
        }
        syntax(line, "unsupported statement '" + word + "'");
    }

    std::vector<Segment> segs_;
    size_t pos_ = 0;
    int depth_ = 0;  // block nesting
};

std::string format_time(const std::string& fmt, const std::string& now) {
    std::tm tm{};
    if (now.empty()) {
        const std::time_t t = std::time(nullptr);
        gmtime_r(&t, &tm);
    } else {
        int y = 0, mo = 1, d = 1, h = 0, mi = 0, s = 0;
        std::sscanf(now.c_str(), "%d-%d-%d %d:%d:%d", &y, &mo, &d, &h, &mi, &s);
        tm.tm_year = y - 1900;
        tm.tm_mon = mo - 1;
        tm.tm_mday = d;
        tm.tm_hour = h;
        tm.tm_min = mi;
        tm.tm_sec = s;
        std::time_t t = timegm(&tm);  // fills weekday and day of year
        gmtime_r(&t, &tm);
    }
    char buf[256];
    const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
    return std::string(buf, n);
}

class Compiled final : public ChatTemplate {
public:
    explicit Compiled(std::string_view src) : body_(Parser(lex(src)).parse_all()) {}

    std::string render(std::string_view messages_json, const ChatOptions& options) const override {
        try {
            return render_checked(messages_json, options);
        } catch (const Error&) {
            throw;
        } catch (const std::exception& e) {
            throw Error(Code::InvalidRequest, std::string("chat template: ") + e.what());
        }
    }

private:
    std::string render_checked(std::string_view messages_json, const ChatOptions& options) const {
        RenderArena arena;  // first: it outlives every value of the render and frees their cycles
        auto globals = std::make_shared<Scope>();
        if (!options.extra_json.empty()) {
            Value extra = from_json(options.extra_json);
            if (extra.t != Value::T::Obj) runtime("extra variables must be a JSON object");
            for (const auto& [k, v] : extra.o->items) globals->vars[k] = v;
        }
        Value messages = from_json(messages_json);
        if (messages.t != Value::T::Arr) runtime("messages must be a JSON array");
        globals->vars["messages"] = messages;
        globals->vars["add_generation_prompt"] = Value::boolean(options.add_generation_prompt);
        globals->vars["bos_token"] = Value::str(options.bos_token);
        globals->vars["eos_token"] = Value::str(options.eos_token);
        if (!options.tools_json.empty()) globals->vars["tools"] = from_json(options.tools_json);
        else globals->vars["tools"] = Value::none();
        globals->vars["raise_exception"] = Value::function([](Args& a, Kwargs&) -> Value {
            runtime(a.empty() ? "raise_exception" : to_output(a[0]));
        });
        const std::string now = options.now;
        globals->vars["strftime_now"] = Value::function([now](Args& a, Kwargs&) -> Value {
            return Value::str(format_time(a.empty() ? "" : to_output(a[0]), now));
        });
        globals->vars["namespace"] = Value::function([](Args& a, Kwargs& k) -> Value {
            Value ns = Value::object();
            ns.o->is_namespace = true;
            for (const auto& x : a)
                if (x.t == Value::T::Obj) for (const auto& [key, v] : x.o->items) ns.o->set(key, v);
            for (auto& [key, v] : k) ns.o->set(key, v);
            return ns;
        });
        globals->vars["range"] = Value::function([](Args& a, Kwargs&) -> Value {
            int64_t lo = 0, hi = 0, step = 1;
            if (a.size() == 1) hi = a[0].i;
            else if (a.size() >= 2) { lo = a[0].i; hi = a[1].i; if (a.size() > 2) step = a[2].i; }
            // In 128 bits: hi - lo overflows int64 for extreme arguments.
            if (step == 0 || (__int128(hi) - lo) / step > 100000) runtime("bad range()");
            Value out = Value::array();
            for (int64_t k = lo; step > 0 ? k < hi : k > hi; k += step) out.a->push_back(Value::integer(k));
            return out;
        });

        std::string out;
        Context c;
        c.scopes.push_back(globals);
        c.out = &out;
        c.options = &options;
        run_body(body_, c);
        return out;
    }

    Body body_;
};

}  // namespace
}  // namespace eh::tokenizer::jinja

namespace eh::tokenizer {

std::shared_ptr<const ChatTemplate> ChatTemplate::compile(std::string_view source) {
    try {
        return std::make_shared<jinja::Compiled>(source);
    } catch (const Error&) {
        throw;
    } catch (const std::exception& e) {
        // A template is input: whatever it provokes is its error, never the host's crash.
        throw Error(Code::InvalidRequest, std::string("chat template: ") + e.what());
    }
}

}  // namespace eh::tokenizer
