// The evaluator: what each tree node does when a template renders, and the
// builtins chat templates call (str and dict methods, filters, tests), in
// Python's and Jinja's semantics where templates depend on them.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "tree.hpp"

namespace eh::tokenizer::jinja {

namespace {

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

}  // namespace

void run_body(const Body& b, Context& c) {
    for (const auto& n : b) {
        c.step();
        n->run(c);
        if (c.signal.brk || c.signal.cont) return;
    }
}

Value Literal::eval(Context&) const { return v; }

Value Name::eval(Context& c) const { return c.lookup(name); }

Value ListLit::eval(Context& c) const {
    Value v = Value::array();
    for (const auto& e : items) v.a->push_back(e->eval(c));
    return v;
}

Value DictLit::eval(Context& c) const {
    Value v = Value::object();
    for (const auto& [k, x] : items) {
        Value key = k->eval(c);
        v.o->set(to_output(key), x->eval(c));
    }
    return v;
}

Value GetAttr::eval(Context& c) const { return get_item(obj->eval(c), Value::str(name)); }

Value GetItem::eval(Context& c) const { return get_item(obj->eval(c), key->eval(c)); }

Value Slice::eval(Context& c) const {
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

Value CondExpr::eval(Context& c) const {
    if (cond->eval(c).truthy()) return yes->eval(c);
    return no ? no->eval(c) : Value();
}

Value Unary::eval(Context& c) const {
    Value v = e->eval(c);
    if (op == '!') return Value::boolean(!v.truthy());
    if (v.t == Value::T::Int) return Value::integer(op == '-' ? -v.i : v.i);
    if (v.numeric()) return Value::number(op == '-' ? -v.as_double() : v.as_double());
    runtime("unary " + std::string(1, op) + " on a non-number");
}

Value Binary::eval(Context& c) const {
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

void CallArgs::eval(Context& c, Args& a, Kwargs& k) const {
    for (const auto& e : args) a.push_back(e->eval(c));
    for (const auto& [n, e] : kwargs) k.emplace_back(n, e->eval(c));
}

Value Call::eval(Context& c) const {
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

Value Filter::eval(Context& c) const {
    const Value v = e->eval(c);
    Args a;
    Kwargs k;
    args.eval(c, a, k);
    return apply_filter(name, v, a, k);
}

Value Test::eval(Context& c) const {
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

void TextNode::run(Context& c) const { c.emit(text); }

void OutputNode::run(Context& c) const { c.emit(to_output(e->eval(c))); }

void IfNode::run(Context& c) const {
    for (const auto& [cond, body] : branches)
        if (!cond || cond->eval(c).truthy()) { run_body(body, c); return; }
}

void ForNode::run(Context& c) const {
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

void SetNode::run(Context& c) const {
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

void SignalNode::run(Context& c) const { (brk ? c.signal.brk : c.signal.cont) = true; }

void MacroNode::run(Context& c) const {
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

}  // namespace eh::tokenizer::jinja
