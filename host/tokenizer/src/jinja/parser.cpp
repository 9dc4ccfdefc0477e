#include "parser.hpp"

#include <algorithm>

namespace eh::tokenizer::jinja {
namespace {

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

}  // namespace

Body parse(std::vector<Segment> segments) { return Parser(std::move(segments)).parse_all(); }

}  // namespace eh::tokenizer::jinja
