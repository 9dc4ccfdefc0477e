// The trees the parser builds and the evaluator walks: expressions (each
// evaluates to a Value) and statements (each runs, emitting text), with the
// render's state. Evaluation is defined in eval.cpp; the parser (parser.cpp)
// only fills the fields.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "eh/tokenizer/chat_template.hpp"
#include "limits.hpp"
#include "value.hpp"

namespace eh::tokenizer::jinja {

struct Context;
struct Expr {
    virtual ~Expr() = default;
    virtual Value eval(Context& c) const = 0;
    int height = 1;  // levels down to its deepest leaf; at most kMaxNesting (the parser's raise)
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

// A render's state: the scopes (for-loop bodies and macros get their own;
// if does not), where output goes, and the budgets ChatOptions sets.
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

// Runs each statement of `b`, stopping at a break or continue.
void run_body(const Body& b, Context& c);

// ------------------------------------------------------------ expressions --

struct Literal : Expr {
    Value v;
    explicit Literal(Value x) : v(std::move(x)) {}
    Value eval(Context&) const override;
};

struct Name : Expr {
    std::string name;
    explicit Name(std::string n) : name(std::move(n)) {}
    Value eval(Context& c) const override;
};

struct ListLit : Expr {
    std::vector<ExprP> items;
    Value eval(Context& c) const override;
};

struct DictLit : Expr {
    std::vector<std::pair<ExprP, ExprP>> items;
    Value eval(Context& c) const override;
};

struct GetAttr : Expr {
    ExprP obj;
    std::string name;
    Value eval(Context& c) const override;
};

struct GetItem : Expr {
    ExprP obj, key;
    Value eval(Context& c) const override;
};

struct Slice : Expr {
    ExprP obj, start, stop, step;
    Value eval(Context& c) const override;
};

struct CondExpr : Expr {
    ExprP cond, yes, no;
    Value eval(Context& c) const override;
};

struct Unary : Expr {
    char op;  // '!' (not), '-' or '+'
    ExprP e;
    Value eval(Context& c) const override;
};

struct Binary : Expr {
    std::string op;
    ExprP l, r;
    Value eval(Context& c) const override;
};

struct CallArgs {
    std::vector<ExprP> args;
    std::vector<std::pair<std::string, ExprP>> kwargs;
    void eval(Context& c, Args& a, Kwargs& k) const;
};

struct Call : Expr {
    ExprP callee;
    CallArgs args;
    Value eval(Context& c) const override;
};

struct Filter : Expr {
    ExprP e;
    std::string name;
    CallArgs args;
    Value eval(Context& c) const override;
};

struct Test : Expr {
    ExprP e;
    std::string name;
    bool negate = false;
    CallArgs args;
    Value eval(Context& c) const override;
};

// ------------------------------------------------------------- statements --

struct TextNode : Node {
    std::string text;
    void run(Context& c) const override;
};

struct OutputNode : Node {
    ExprP e;
    void run(Context& c) const override;
};

struct IfNode : Node {
    std::vector<std::pair<ExprP, Body>> branches;  // a null condition is "else"
    void run(Context& c) const override;
};

struct ForNode : Node {
    std::vector<std::string> vars;
    ExprP iter, filter;
    Body body, else_body;
    void run(Context& c) const override;
};

struct SetNode : Node {
    std::string name, attr;  // attr set: `set ns.attr = ...`
    ExprP e;
    Body block;              // `{% set x %}...{% endset %}`
    void run(Context& c) const override;
};

struct SignalNode : Node {
    bool brk;
    explicit SignalNode(bool b) : brk(b) {}
    void run(Context& c) const override;
};

struct MacroNode : Node {
    std::string name;
    std::vector<std::string> params;
    std::vector<ExprP> defaults;  // per param, may be null
    Body body;
    void run(Context& c) const override;
};

}  // namespace eh::tokenizer::jinja
