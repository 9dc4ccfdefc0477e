// JSON schema -> grammar text. The subset is OpenAI's strict structured
// outputs: type (string, number, integer, boolean, null, object, array, or
// an array of these), properties, required, additionalProperties (false, or
// a schema when there are no properties), enum, const, anyOf, items,
// minItems, maxItems, $ref to "#", "#/$defs/..." or "#/definitions/..."
// (recursion allowed), $defs/definitions. Annotations are ignored. Any other
// keyword is refused by name: the output must match the schema, and a
// keyword the grammar does not enforce would be silently broken.
//
// Recursion. A $ref inside an object or array is a reference to the target's
// rule. A $ref that stands for the whole value, alone or as an anyOf
// alternative ({"anyOf":[{"$ref":"#"},{"type":"null"}]}), would make a rule
// that starts with itself, which the grammar refuses as left-recursive; such
// a reference means "or anything the target allows", so each target's rule
// is the union of its own alternatives and those of every target it reaches
// that way (a cycle adds nothing; the least fixed point, as a validator that
// stops at a cycle sees it). A target that reaches only itself matches
// nothing and is refused. At most kMaxSchemaRefs different targets.
//
// Objects are written with their properties in the schema's order; a
// property not in `required` may be left out; no others appear.
#include <fmt/format.h>

#include <climits>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>
#include <nlohmann/json.hpp>
#include <set>

#include "eh/constrain/grammar.hpp"
#include "gbnf_ast.hpp"
#include "json_grammar_text.hpp"

namespace eh::constrain::detail {
namespace {

using Json = nlohmann::ordered_json;

const std::set<std::string, std::less<>> kAnnotations = {
    "description", "title", "$schema", "$id", "$comment", "examples", "default", "deprecated", "readOnly", "writeOnly"};
const std::set<std::string, std::less<>> kHandled = {
    "type", "properties", "required", "additionalProperties", "enum", "const", "anyOf", "items",
    "minItems", "maxItems", "$ref", "$defs", "definitions"};

// Different $ref targets in one schema: each may add a rule holding every
// target it reaches (kMaxSchemaRefs^2 names at worst, and the grammar text
// limit stops that long before).
constexpr size_t kMaxSchemaRefs = 1000;

// Nesting depth of JSON text, without building it (a deep document would
// recurse in the JSON library).
size_t json_depth(std::string_view s) {
    size_t depth = 0, max = 0;
    bool in_str = false;
    for (size_t i = 0; i < s.size(); ++i) {
        const char c = s[i];
        if (in_str) {
            if (c == '\\') ++i;
            else if (c == '"') in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (c == '{' || c == '[') {
            max = std::max(max, ++depth);
        } else if ((c == '}' || c == ']') && depth) {
            --depth;
        }
    }
    return max;
}

std::string pointer_unescape(std::string_view s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '~' && i + 1 < s.size() && (s[i + 1] == '0' || s[i + 1] == '1')) {
            out.push_back(s[i + 1] == '0' ? '~' : '/');
            ++i;
        } else {
            out.push_back(s[i]);
        }
    }
    return out;
}

class SchemaCompiler {
public:
    SchemaCompiler(const Json& root, std::string prefix, std::string& out) : root_(root), prefix_(std::move(prefix)), out_(out) {}

    // The schema's expression; the rules it names are appended to `out`.
    std::string compile() {
        std::string expr = value(root_, "", 0);
        write_target_rules();
        return expr;
    }

    std::string value(const Json& s, const std::string& path, uint32_t depth) {
        if (depth > kMaxGrammarNesting)
            throw GrammarError("", fmt::format("the schema nests deeper than {} levels at {}", kMaxGrammarNesting, at(path)));
        if (s.is_boolean()) {
            if (s.get<bool>()) return "j-value";
            throw GrammarError("false", fmt::format("the schema 'false' at {} matches nothing", at(path)));
        }
        if (!s.is_object()) throw GrammarError("", fmt::format("the schema at {} must be an object or a boolean", at(path)));
        for (const auto& [k, v] : s.items()) {
            if (kAnnotations.count(k) || kHandled.count(k)) continue;
            throw GrammarError(k, fmt::format("the JSON-schema keyword '{}' at {} is not supported", k, at(path)));
        }
        if (auto r = s.find("$ref"); r != s.end()) {
            for (const auto& [k, v] : s.items())
                if (k != "$ref" && k != "$defs" && k != "definitions" && !kAnnotations.count(k))
                    throw GrammarError(k, fmt::format("'{}' beside '$ref' at {} is not supported", k, at(path)));
            return ref(*r, path);
        }
        if (auto c = s.find("const"); c != s.end()) return rule(literal(c->dump()));
        if (auto e = s.find("enum"); e != s.end()) {
            if (!e->is_array() || e->empty())
                throw GrammarError("enum", fmt::format("'enum' at {} must be a non-empty array", at(path)));
            std::string alts;
            for (const auto& v : *e) alts += (alts.empty() ? "" : " | ") + literal(v.dump());
            return rule(alts);
        }
        if (auto a = s.find("anyOf"); a != s.end()) {
            if (!a->is_array() || a->empty())
                throw GrammarError("anyOf", fmt::format("'anyOf' at {} must be a non-empty array", at(path)));
            for (const auto& [k, v] : s.items())
                if (k != "anyOf" && k != "$defs" && k != "definitions" && !kAnnotations.count(k))
                    throw GrammarError(k, fmt::format("'{}' beside 'anyOf' at {} is not supported (put it inside each "
                                                      "alternative)", k, at(path)));
            std::string alts;
            for (size_t i = 0; i < a->size(); ++i) {
                const std::string alt = value((*a)[i], path + "/anyOf/" + std::to_string(i), depth + 1);
                if (!alt.empty()) alts += (alts.empty() ? "" : " | ") + alt;  // "": a $ref folded into the target
            }
            return alts.empty() ? "" : rule(alts);
        }
        std::vector<std::string> types;
        if (auto t = s.find("type"); t != s.end()) {
            if (t->is_string()) types.push_back(t->get<std::string>());
            else if (t->is_array() && !t->empty())
                for (const auto& x : *t) {
                    if (!x.is_string()) throw GrammarError("type", fmt::format("'type' at {} must hold strings", at(path)));
                    types.push_back(x.get<std::string>());
                }
            else throw GrammarError("type", fmt::format("'type' at {} must be a string or a non-empty array", at(path)));
        } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
            types.push_back("object");
        } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
            types.push_back("array");
        } else {
            return "j-value";
        }
        std::string alts;
        for (const auto& t : types) {
            std::string e;
            if (t == "string") e = "j-string";
            else if (t == "number") e = "j-number";
            else if (t == "integer") e = "j-integer";
            else if (t == "boolean") e = "j-boolean";
            else if (t == "null") e = "j-null";
            else if (t == "object") e = inside([&] { return object(s, path, depth); });
            else if (t == "array") e = inside([&] { return array(s, path, depth); });
            else throw GrammarError("type", fmt::format("'type' '{}' at {} is not a JSON-schema type", t, at(path)));
            alts += (alts.empty() ? "" : " | ") + e;
        }
        return types.size() == 1 ? alts : rule(alts);
    }

private:
    static std::string at(const std::string& path) { return path.empty() ? "the root" : "'" + path + "'"; }

    std::string fresh() { return fmt::format("{}s{}", prefix_, counter_++); }
    // A new rule holding `body`; returns its name.
    std::string rule(const std::string& body) {
        std::string name = fresh();
        out_ += name + " ::= " + body + "\n";
        return name;
    }

    // A $ref target: its own alternatives' rule (`own`, "" when it has none),
    // the rule used by references to it (`all`: its own alternatives and
    // those of the targets in `folded`, the $refs that stand for its whole
    // value), and where it was first named from a position that uses `all`.
    struct Target {
        std::string name;
        std::string own;
        std::string all;
        std::vector<size_t> folded;
        std::string used_at;  // "" while no such reference exists
        bool used = false;
    };

    // Compiles an object or array: a $ref inside consumes text first, so it
    // is never folded into the target being compiled.
    template <class F>
    std::string inside(F&& f) {
        const std::optional<size_t> saved = std::exchange(folding_, std::nullopt);
        std::string e = f();
        folding_ = saved;
        return e;
    }

    std::string ref(const Json& r, const std::string& path) {
        if (!r.is_string()) throw GrammarError("$ref", fmt::format("'$ref' at {} must be a string", at(path)));
        const std::string target = r.get<std::string>();
        const size_t t = target_index(target, path);
        if (folding_) {
            targets_[*folding_].folded.push_back(t);
            return "";
        }
        if (!targets_[t].used) {
            targets_[t].used = true;
            targets_[t].used_at = path;
        }
        return targets_[t].all;
    }

    // The target's index, compiling it when first named. Its rule names are
    // fixed before its schema is compiled, so a reference inside finds them.
    size_t target_index(const std::string& target, const std::string& path) {
        if (auto it = refs_.find(target); it != refs_.end()) return it->second;
        const Json* node = nullptr;
        if (target == "#") {
            node = &root_;
        } else {
            for (const char* base : {"#/$defs/", "#/definitions/"}) {
                const std::string_view b(base);
                if (target.rfind(b, 0) != 0) continue;
                const std::string name = pointer_unescape(std::string_view(target).substr(b.size()));
                auto defs = root_.find(std::string(b.substr(2, b.size() - 3)));
                if (defs == root_.end() || !defs->is_object()) continue;
                if (auto d = defs->find(name); d != defs->end()) node = &*d;
            }
        }
        if (!node)
            throw GrammarError("$ref", fmt::format("'$ref' '{}' at {} does not name the root or an entry of "
                                                   "$defs/definitions", target.substr(0, 200), at(path)));
        if (targets_.size() >= kMaxSchemaRefs)
            throw GrammarError("$ref", fmt::format("'$ref' '{}' at {}: a schema's $refs may name at most {} different "
                                                   "schemas", target.substr(0, 200), at(path), kMaxSchemaRefs));
        const size_t t = targets_.size();
        targets_.push_back(Target{target, fresh(), fresh(), {}, "", false});
        refs_[target] = t;
        const std::optional<size_t> saved = std::exchange(folding_, t);
        const std::string body = value(*node, target, ++ref_depth_ > kMaxGrammarNesting ? kMaxGrammarNesting + 1 : 0);
        --ref_depth_;
        folding_ = saved;
        if (body.empty()) targets_[t].own.clear();
        else out_ += targets_[t].own + " ::= " + body + "\n";
        return t;
    }

    // Each referenced target's `all` rule: the own rules of every target it
    // reaches through folded $refs, itself included.
    void write_target_rules() {
        std::vector<size_t> seen(targets_.size(), SIZE_MAX), todo;
        for (size_t t = 0; t < targets_.size(); ++t) {
            if (!targets_[t].used) continue;
            std::string alts;
            todo.assign(1, t);
            seen[t] = t;
            while (!todo.empty()) {
                const size_t u = todo.back();
                todo.pop_back();
                if (!targets_[u].own.empty()) alts += (alts.empty() ? "" : " | ") + targets_[u].own;
                for (size_t v : targets_[u].folded)
                    if (seen[v] != t) seen[v] = t, todo.push_back(v);
            }
            if (alts.empty())
                throw GrammarError("$ref", fmt::format("'$ref' '{}' at {} matches nothing: it leads only to $refs "
                                                       "of itself",
                                                       targets_[t].name.substr(0, 200), at(targets_[t].used_at)));
            out_ += targets_[t].all + " ::= " + alts + "\n";
            if (out_.size() > kMaxGrammarTextBytes) return;  // the caller's size check says so
        }
    }

    std::string object(const Json& s, const std::string& path, uint32_t depth) {
        const Json* props = nullptr;
        if (auto p = s.find("properties"); p != s.end()) {
            if (!p->is_object()) throw GrammarError("properties", fmt::format("'properties' at {} must be an object", at(path)));
            props = &*p;
        }
        const Json* extra = nullptr;
        if (auto a = s.find("additionalProperties"); a != s.end()) {
            if (!a->is_boolean() && !a->is_object())
                throw GrammarError("additionalProperties",
                                   fmt::format("'additionalProperties' at {} must be a boolean or a schema", at(path)));
            if (!(a->is_boolean() && !a->get<bool>())) extra = &*a;
        }
        std::set<std::string> required;
        if (auto r = s.find("required"); r != s.end()) {
            if (!r->is_array()) throw GrammarError("required", fmt::format("'required' at {} must be an array", at(path)));
            for (const auto& x : *r) {
                if (!x.is_string()) throw GrammarError("required", fmt::format("'required' at {} must hold strings", at(path)));
                if (!props || !props->contains(x.get<std::string>()))
                    throw GrammarError("required", fmt::format("'required' at {} names '{}', which is not in 'properties'",
                                                               at(path), x.get<std::string>().substr(0, 100)));
                required.insert(x.get<std::string>());
            }
        }
        if (!props || props->empty()) {
            if (!extra && s.contains("additionalProperties")) return rule(R"("{" j-ws "}")");
            if (!extra || extra->is_boolean()) return "j-object";
            // A map: any keys, every value matching the schema.
            const std::string v = value(*extra, path + "/additionalProperties", depth + 1);
            return rule(fmt::format(R"("{{" j-ws ( j-string j-ws ":" j-ws {0} j-ws ( "," j-ws j-string j-ws ":" j-ws {0} j-ws )* )? "}}")", v));
        }
        if (extra)
            throw GrammarError("additionalProperties",
                               fmt::format("'additionalProperties' at {} must be false when 'properties' is given", at(path)));
        // first(i): the members from property i on, none written yet;
        // rest(i): the same after at least one (each starts with a comma).
        std::vector<std::string> kv;
        std::vector<bool> req;
        for (const auto& [k, v] : props->items()) {
            const std::string sub = value(v, path + "/properties/" + k, depth + 1);
            kv.push_back(literal(Json(k).dump()) + R"( j-ws ":" j-ws )" + sub);
            req.push_back(required.count(k) != 0);
        }
        const size_t n = kv.size();
        const std::string base = fresh();
        auto first = [&](size_t i) { return fmt::format("{}-f{}", base, i); };
        auto rest = [&](size_t i) { return fmt::format("{}-r{}", base, i); };
        for (size_t i = 0; i <= n; ++i) {
            if (i == n) {
                out_ += first(i) + " ::= \n" + rest(i) + " ::= \n";
                continue;
            }
            out_ += first(i) + " ::= " + kv[i] + " j-ws " + rest(i + 1) + (req[i] ? "" : " | " + first(i + 1)) + "\n";
            out_ += rest(i) + R"( ::= "," j-ws )" + kv[i] + " j-ws " + rest(i + 1) + (req[i] ? "" : " | " + rest(i + 1)) + "\n";
        }
        out_ += base + R"( ::= "{" j-ws )" + first(0) + " \"}\"\n";
        return base;
    }

    std::string array(const Json& s, const std::string& path, uint32_t depth) {
        std::string item = "j-value";
        if (auto it = s.find("items"); it != s.end()) item = value(*it, path + "/items", depth + 1);
        auto bound = [&](const char* key, uint64_t dflt) -> uint64_t {
            auto b = s.find(key);
            if (b == s.end()) return dflt;
            if (!b->is_number_unsigned())
                throw GrammarError(key, fmt::format("'{}' at {} must be a non-negative integer", key, at(path)));
            const uint64_t v = b->get<uint64_t>();
            if (v > kMaxRepeat && std::string_view(key) == "minItems")
                throw GrammarError(key, fmt::format("'{}' at {} is above the limit of {}", key, at(path), kMaxRepeat));
            return v;
        };
        const uint64_t lo = bound("minItems", 0);
        uint64_t hi = bound("maxItems", kUnbounded);
        if (hi != kUnbounded && hi > kMaxRepeat) {
            throw GrammarError("maxItems", fmt::format("'maxItems' at {} is above the limit of {}", at(path), kMaxRepeat));
        }
        if (hi < lo) throw GrammarError("maxItems", fmt::format("'maxItems' at {} is below 'minItems'", at(path)));
        if (hi == 0) return rule(R"("[" j-ws "]")");
        const std::string more = fmt::format(R"(( "," j-ws {} j-ws ))", item);
        std::string reps;
        const uint64_t rlo = lo ? lo - 1 : 0;
        if (hi == kUnbounded) reps = rlo ? fmt::format("{}{{{},}}", more, rlo) : more + "*";
        else reps = fmt::format("{}{{{},{}}}", more, rlo, hi - 1);
        std::string items = fmt::format("{} j-ws {}", item, reps);
        if (lo == 0) items = "( " + items + " )?";
        return rule(fmt::format(R"("[" j-ws {} "]")", items));
    }

    const Json& root_;
    std::string prefix_;
    std::string& out_;
    size_t counter_ = 0;
    uint32_t ref_depth_ = 0;
    std::map<std::string, size_t> refs_;  // target -> index in targets_
    std::vector<Target> targets_;
    // The target whose own alternatives are being compiled, while no text
    // has been consumed since its start: a $ref here is folded into it.
    std::optional<size_t> folding_;
};

}  // namespace

std::string literal(std::string_view bytes) {
    std::string out = "\"";
    for (unsigned char c : bytes) {
        if (c == '"' || c == '\\') out += '\\', out += char(c);
        else if (c < 0x20) out += fmt::format("\\x{:02X}", c);
        else out += char(c);
    }
    return out + "\"";
}

const std::string& json_base_rules() {
    // Bounded blanks and digits (as llama.cpp's schema grammars do): a model
    // that keeps choosing a space or a 7 still reaches the end.
    static const std::string rules = R"(j-ws ::= ( " " | "\n" [ \t]{0,20} )?
j-value ::= j-object | j-array | j-string | j-number | "true" | "false" | "null"
j-object ::= "{" j-ws ( j-string j-ws ":" j-ws j-value j-ws ( "," j-ws j-string j-ws ":" j-ws j-value j-ws )* )? "}"
j-array ::= "[" j-ws ( j-value j-ws ( "," j-ws j-value j-ws )* )? "]"
j-string ::= "\"" j-char* "\""
j-char ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" j-u4 )
j-u4 ::= [0-9a-cA-CeEfF] j-hex j-hex j-hex | [dD] [0-7] j-hex j-hex | [dD] [89abAB] j-hex j-hex "\\u" [dD] [c-fC-F] j-hex j-hex
j-hex ::= [0-9a-fA-F]
j-number ::= "-"? j-int ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?
j-integer ::= "-"? j-int
j-int ::= "0" | [1-9] [0-9]{0,15}
j-boolean ::= "true" | "false"
j-null ::= "null"
)";
    return rules;
}

std::string schema_rules(std::string_view schema_json, const std::string& prefix, std::string& out) {
    if (schema_json.empty()) return "j-value";
    if (json_depth(schema_json) > 4 * kMaxGrammarNesting)
        throw GrammarError("", fmt::format("the schema nests deeper than {} levels", kMaxGrammarNesting));
    Json root;
    try {
        root = Json::parse(schema_json);
    } catch (const std::exception& e) {
        throw GrammarError("", std::string("the schema is not valid JSON: ") + e.what());
    }
    const std::string expr = SchemaCompiler(root, prefix, out).compile();
    if (out.size() > kMaxGrammarTextBytes)
        throw GrammarError("", fmt::format("the schema compiles to a grammar of more than {} bytes", kMaxGrammarTextBytes));
    return expr;
}

}  // namespace eh::constrain::detail

namespace eh::constrain {

std::shared_ptr<const Grammar> json_schema_grammar(std::string_view schema_json) {
    std::string rules = detail::json_base_rules();
    const std::string expr = detail::schema_rules(schema_json, "x-", rules);
    rules += "root ::= j-ws " + expr + "\n";
    return gbnf_grammar(rules);
}

std::shared_ptr<const Grammar> json_object_grammar() {
    static const auto g = gbnf_grammar(detail::json_base_rules() + "root ::= j-ws j-object\n");
    return g;
}

std::shared_ptr<const Grammar> tagged_json_grammar(const std::vector<TaggedJson>& alternatives, uint32_t min_count,
                                                   uint32_t max_count, std::string_view separator) {
    if (alternatives.empty()) throw GrammarError("", "tagged JSON needs at least one alternative");
    if (max_count < 1 || min_count > max_count || max_count > kMaxRepeat)
        throw GrammarError("", fmt::format("tagged JSON counts must satisfy 1 <= max_count <= {} and min_count <= max_count",
                                           kMaxRepeat));
    std::string rules = detail::json_base_rules();
    std::string part;
    for (size_t i = 0; i < alternatives.size(); ++i) {
        const auto& a = alternatives[i];
        const std::string expr = detail::schema_rules(a.schema_json, fmt::format("t{}-", i), rules);
        part += (i ? " | " : "") + detail::literal(a.prefix) + " " + expr + " " + detail::literal(a.suffix);
    }
    rules += "t-part ::= " + part + "\n";
    const uint32_t lo = min_count ? min_count - 1 : 0;
    std::string body = fmt::format("t-part ( {} t-part ){{{},{}}}", detail::literal(separator), lo, max_count - 1);
    if (min_count == 0) body = "( " + body + " )?";
    rules += "root ::= " + body + "\n";
    return gbnf_grammar(rules);
}

}  // namespace eh::constrain
