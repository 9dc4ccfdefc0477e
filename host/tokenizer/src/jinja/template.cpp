// A small Jinja2 interpreter for chat templates: lexer.cpp cuts the source
// into segments and tokens, parser.cpp builds the trees of tree.hpp, and
// eval.cpp runs them. This file is the render: the globals a chat template
// sees (messages, tools, raise_exception, strftime_now, namespace, range)
// and ChatTemplate::compile.
#include <cstdio>
#include <ctime>

#include "eh/error.hpp"
#include "eh/tokenizer/chat_template.hpp"
#include "parser.hpp"
#include "tree.hpp"
#include "value.hpp"

namespace eh::tokenizer::jinja {
namespace {

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
    explicit Compiled(std::string_view src) : body_(parse(lex(src))) {}

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
