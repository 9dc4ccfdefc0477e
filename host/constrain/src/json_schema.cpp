// JSON schema -> grammar text (docs/http-api.md, "Structured output").
//
// One policy: a keyword that constrains the instance is either enforced by
// the grammar or refused by name (the output must match the schema, and a
// constraint the grammar does not enforce would be silently broken);
// annotations and keywords this compiler does not know are ignored, as the
// JSON Schema specification asks of a validator. Where enforcing exactly
// would blow up the grammar, the grammar allows LESS than the schema
// (narrowing: the output still validates), never more; docs/http-api.md
// lists each such place.
//
// Enforced: type, properties, required, additionalProperties, enum, const,
// anyOf, oneOf (as anyOf), allOf and $ref with sibling keywords (merged into
// one schema first: merge()), items/prefixItems/additionalItems,
// minItems/maxItems, minLength/maxLength, pattern (regex.cpp), format
// (kFormats), minimum/maximum/exclusiveMinimum/exclusiveMaximum,
// min/maxProperties where the property list decides them.
//
// Recursion. A $ref inside an object or array is a reference to the target's
// rule. A $ref that stands for the whole value, alone or as an anyOf
// alternative ({"anyOf":[{"$ref":"#"},{"type":"null"}]}), would make a rule
// that starts with itself, which the grammar refuses as left-recursive; such
// a reference means "or anything the target allows", so each target's rule
// is the union of its own alternatives and those of every target it reaches
// that way (a cycle adds nothing; the least fixed point, as a validator that
// stops at a cycle sees it). A target that reaches only itself matches
// nothing and is refused. At most kMaxSchemaRefs different targets. A
// schema merged from $ref/allOf is a target too (keyed by its text), so a
// recursive one compiles once.
//
// Objects are written with their properties in the schema's order; a
// property not in `required` may be left out; no others appear.
#include <fmt/format.h>

#include <algorithm>
#include <bitset>
#include <cctype>
#include <climits>
#include <cmath>
#include <deque>
#include <functional>
#include <cstdint>
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>
#include <nlohmann/json.hpp>
#include <simdjson.h>
#include <set>

#include "eh/constrain/automaton.hpp"
#include "eh/constrain/grammar.hpp"
#include "eh/constrain/vocab.hpp"
#include "gbnf_ast.hpp"
#include "json_grammar_text.hpp"
#include "regex.hpp"

namespace eh::constrain::detail {
namespace {

using Json = nlohmann::ordered_json;
// Keyword lookups take string_views: an ordered object's find compares each
// key, and a view compares lengths first where a C string is measured anew.
using namespace std::string_view_literals;

// Keyword sets, looked up for every key of every schema: hashed.
using WordSet = std::unordered_set<std::string_view>;

// Keywords that say nothing about the instance (listed so a merge can drop
// them; any key not in kHandled or kRefused is ignored the same way).
const WordSet kAnnotations = {
    "description", "title", "$schema", "$id", "id", "$anchor", "$dynamicAnchor", "$comment", "examples", "default",
    "deprecated", "readOnly", "writeOnly", "contentMediaType", "contentEncoding", "contentSchema", "$vocabulary"};
// A schema no value matches (a merge with nothing in common, an enum with
// no value of the type, `false`): an anyOf alternative that is one is left
// out, and so is an optional property; elsewhere it is the 400 it names.
class EmptySchema : public GrammarError {
public:
    using GrammarError::GrammarError;
};

// Where flatten() keeps a merged schema's if/then/else parts until the
// whole schema is merged (merged() applies them); no schema keyword.
const char* const kConditionals = "$eh-conditionals";
// Keywords the grammar enforces.
const WordSet kHandled = {
    "type", "properties", "required", "additionalProperties", "enum", "const", "anyOf", "oneOf", "allOf", "items",
    "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems", "$ref", "minLength", "maxLength",
    "pattern", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minProperties",
    "maxProperties", "patternProperties", "multipleOf", "dependentRequired", "dependencies", "propertyNames",
    "contains", "not", "dependentSchemas"};
// Keywords that constrain the instance and are not enforced: refused by
// name wherever they would constrain (an empty object or array of them
// constrains nothing and is ignored).
const WordSet kRefused = {
    "not", "minContains", "maxContains", "unevaluatedProperties", "unevaluatedItems", "$dynamicRef",
    "$recursiveRef"};
// Keywords that make a schema's type object, array, string or number when
// it has no `type` (narrowing: the schema alone would allow any other type).
const std::set<std::string, std::less<>> kObjectWords = {"properties", "additionalProperties", "required",
                                                         "minProperties", "maxProperties", "patternProperties",
                                                         "dependentRequired", "dependencies", "propertyNames"};
const std::set<std::string, std::less<>> kArrayWords = {"items", "prefixItems", "additionalItems", "minItems",
                                                        "maxItems", "uniqueItems", "contains"};
const std::set<std::string, std::less<>> kStringWords = {"minLength", "maxLength", "pattern", "format"};
const std::set<std::string, std::less<>> kNumberWords = {"minimum", "maximum", "exclusiveMinimum",
                                                         "exclusiveMaximum", "multipleOf"};

// `format` values enforced, as ECMA-262 patterns compiled like `pattern`.
// Practical subsets where the RFC is larger (docs/http-api.md says which):
// dates check days per month and leap years; time's fraction has at most 9
// digits and its seconds stop at 59; hostname has at most 4 labels of at
// most 63 characters (so at most 255 in all); email is a dot-atom local part
// and a hostname; uri is a scheme and URI characters (not RFC 3986's whole
// structure); ipv6 is RFC 3986's nine forms (no zone id); duration is RFC
// 3339's (components of at most 9 digits); json-pointer and
// relative-json-pointer are RFC 6901's and the draft's (a prefix of at most
// 9 digits). Other formats are annotations,
// as in 2019-09 and later.
const char* const kDate =
    "(?:[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|"
    "02-(?:0[1-9]|1[0-9]|2[0-8]))|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29)";
const char* const kTime =
    "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,9})?(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";
// A label of 1 to 63 letters, digits and inner hyphens, never "--" at
// positions 3 and 4 (RFC 5891 reserves that for A-labels, which are not
// checked, so they are not written: narrowing).
const char* const kHostLabel =
    "(?:[A-Za-z0-9](?:[A-Za-z0-9-]?[A-Za-z0-9])?|[A-Za-z0-9][A-Za-z0-9-]{2}[A-Za-z0-9]|"
    "[A-Za-z0-9][A-Za-z0-9-](?:[A-Za-z0-9][A-Za-z0-9-]|-[A-Za-z0-9])[A-Za-z0-9-]{0,58}[A-Za-z0-9])";
std::string format_pattern(std::string_view f) {
    const std::string label = kHostLabel, host = label + "(?:\\." + label + "){0,3}";
    const std::string octet = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";
    const std::string atext = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]";
    if (f == "date") return std::string("^") + kDate + "$";
    if (f == "time") return std::string("^") + kTime + "$";
    if (f == "date-time") return std::string("^") + kDate + "[Tt]" + kTime + "$";
    if (f == "uuid") return "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";
    if (f == "ipv4") return "^" + octet + "(?:\\." + octet + "){3}$";
    if (f == "hostname") return "^" + host + "$";
    if (f == "email") return "^" + atext + "{1,64}(?:\\." + atext + "{1,64}){0,3}@" + host + "$";
    if (f == "ipv6") {
        // RFC 3986's nine forms of IPv6address (no zone id).
        const std::string h = "[0-9A-Fa-f]{1,4}", ls32 = "(?:" + h + ":" + h + "|" + octet + "(?:\\." + octet + "){3})";
        auto before = [&](int n) { return n < 0 ? std::string() : "(?:(?:" + h + ":){0," + std::to_string(n) + "}" + h + ")?"; };
        return "^(?:(?:" + h + ":){6}" + ls32 + "|::(?:" + h + ":){5}" + ls32 + "|" + before(0) + "::(?:" + h + ":){4}" + ls32 +
               "|" + before(1) + "::(?:" + h + ":){3}" + ls32 + "|" + before(2) + "::(?:" + h + ":){2}" + ls32 + "|" +
               before(3) + "::" + h + ":" + ls32 + "|" + before(4) + "::" + ls32 + "|" + before(5) + "::" + h + "|" +
               before(6) + "::)$";
    }
    if (f == "duration") {
        // RFC 3339 appendix A: P, then a date part (and maybe a time part), a time part, or weeks.
        const std::string d = "[0-9]{1,9}";
        const std::string time = "T(?:" + d + "H(?:" + d + "M(?:" + d + "S)?)?|" + d + "M(?:" + d + "S)?|" + d + "S)";
        const std::string date = "(?:" + d + "D|" + d + "M(?:" + d + "D)?|" + d + "Y(?:" + d + "M(?:" + d + "D)?)?)";
        return "^P(?:" + date + "(?:" + time + ")?|" + time + "|" + d + "W)$";
    }
    if (f == "json-pointer") return "^(?:/(?:[^~/]|~[01])*)*$";
    if (f == "relative-json-pointer") return "^(?:0|[1-9][0-9]{0,8})(?:#|(?:/(?:[^~/]|~[01])*)*)$";
    if (f == "uri") return "^[A-Za-z][A-Za-z0-9+.-]{0,31}:(?:[A-Za-z0-9._~:/?#\\[\\]@!$&'()*+,;=-]|%[0-9A-Fa-f]{2})*$";
    return "";
}

// The largest integer part JSON numbers may have here (j-int: 16 digits).
constexpr uint64_t kMaxIntPart = 9999999999999999ull;
// The largest integer multipleOf (its digit automaton has 16 rules per remainder).
constexpr uint64_t kMaxMultipleOf = 200;
// Schemas expanded while merging $ref/allOf (each a copy of a subtree), in
// JSON nodes copied: a diamond of allOfs must not grow exponentially.
constexpr size_t kMaxMergeNodes = 200000;
// Alternatives one anyOf may get from merging two anyOfs (their product).
constexpr size_t kMaxMergedAlternatives = 64;

// Different $ref targets in one schema: each may add a rule holding every
// target it reaches (kMaxSchemaRefs^2 names at worst, and the grammar text
// limit stops that long before). Biome's configuration schema has 2,768.
constexpr size_t kMaxSchemaRefs = 5000;

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

// "%25" -> "%" and so on: a $ref is a URI fragment.
std::string percent_unescape(std::string_view s) {
    std::string out;
    auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '%' && i + 2 < s.size() + 0 && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
            out.push_back(char(hex(s[i + 1]) * 16 + hex(s[i + 2])));
            i += 2;
        } else {
            out.push_back(s[i]);
        }
    }
    return out;
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

// ---- $id, $anchor and relative $refs ----
//
// Before compiling, every $ref (at a schema position) is rewritten to an
// absolute reference against the base URI its schema resource has ($id;
// draft 4's `id` when $schema says draft 3/4), and each resource and
// anchor is indexed; a $ref then names one schema however it was written,
// and merged copies of schemas keep references that mean the same thing.
// Nothing is fetched: a reference outside the document is a 400.

bool has_scheme(std::string_view s) {
    if (s.empty() || !std::isalpha(uint8_t(s[0]))) return false;
    size_t i = 1;
    while (i < s.size() && (std::isalnum(uint8_t(s[i])) || s[i] == '+' || s[i] == '-' || s[i] == '.')) ++i;
    return i < s.size() && s[i] == ':';
}

// RFC 3986 section 5.2.4, on a path (no query or fragment handling beyond
// carrying them along).
std::string remove_dots(const std::string& path) {
    const size_t cut = path.find_first_of("?#");
    const std::string p = path.substr(0, cut), tail = cut == std::string::npos ? "" : path.substr(cut);
    std::vector<std::string> out;
    size_t i = 0;
    const bool absolute = !p.empty() && p[0] == '/';
    if (absolute) i = 1;
    bool trailing = false;
    while (i <= p.size()) {
        const size_t j = std::min(p.find('/', i), p.size());
        const std::string seg = p.substr(i, j - i);
        trailing = j == p.size() && (seg == "." || seg == "..");
        if (seg == "..") {
            if (!out.empty()) out.pop_back();
        } else if (seg != ".") {
            out.push_back(seg);
        }
        i = j + 1;
    }
    std::string r = absolute ? "/" : "";
    for (size_t k = 0; k < out.size(); ++k) r += (k ? "/" : "") + out[k];
    if (trailing && (r.empty() || r.back() != '/')) r += "/";
    return r + tail;
}

std::string uri_resolve(const std::string& base_in, const std::string& ref) {
    if (has_scheme(ref)) return ref;
    const std::string base = base_in.substr(0, base_in.find('#'));
    if (ref.empty()) return base;
    if (ref[0] == '#') return base + ref;
    const size_t colon = has_scheme(base) ? base.find(':') : std::string::npos;
    const std::string scheme = colon == std::string::npos ? "" : base.substr(0, colon + 1);
    std::string rest = colon == std::string::npos ? base : base.substr(colon + 1);
    if (ref.rfind("//", 0) == 0) return scheme + ref;
    std::string authority;
    if (rest.rfind("//", 0) == 0) {
        const size_t e = rest.find('/', 2);
        authority = rest.substr(0, e);
        rest = e == std::string::npos ? "" : rest.substr(e);
    }
    std::string path;
    if (ref[0] == '/') path = ref;
    else if (!authority.empty() && rest.empty()) path = "/" + ref;
    else {
        const size_t slash = rest.rfind('/');
        path = (slash == std::string::npos ? "" : rest.substr(0, slash + 1)) + ref;
    }
    return scheme + authority + remove_dots(path);
}

// simdjson's tree as an ordered nlohmann value. A key met twice in one
// object keeps its first place and takes the last value, as nlohmann's own
// parser does.
Json from_simdjson(simdjson::dom::element e) {
    switch (e.type()) {
    case simdjson::dom::element_type::OBJECT: {
        const simdjson::dom::object obj = e.get_object().value_unsafe();
        Json out = Json::object();
        auto& members = out.get_ref<Json::object_t&>();
        members.reserve(obj.size());  // (no reallocation: `seen` views the keys in place)
        std::unordered_map<std::string_view, size_t> seen;  // (large objects only)
        for (auto [k, v] : obj) {
            std::optional<size_t> at;
            if (members.size() < 16) {
                for (size_t i = 0; i < members.size() && !at; ++i)
                    if ((members.begin() + i)->first == k) at = i;
            } else {
                if (seen.empty())
                    for (size_t i = 0; i < members.size(); ++i) seen.emplace((members.begin() + i)->first, i);
                if (auto it = seen.find(k); it != seen.end()) at = it->second;
            }
            if (at) {
                (members.begin() + *at)->second = from_simdjson(v);
                continue;
            }
            members.emplace_back(std::string(k), from_simdjson(v));
            if (!seen.empty()) seen.emplace(members.back().first, members.size() - 1);
        }
        return out;
    }
    case simdjson::dom::element_type::ARRAY: {
        const simdjson::dom::array arr = e.get_array().value_unsafe();
        Json out = Json::array();
        auto& items = out.get_ref<Json::array_t&>();
        items.reserve(arr.size());
        for (auto v : arr) items.push_back(from_simdjson(v));
        return out;
    }
    case simdjson::dom::element_type::STRING: return Json(std::string(e.get_string().value_unsafe()));
    case simdjson::dom::element_type::INT64: {  // (nlohmann reads a non-negative integer as unsigned)
        const int64_t v = e.get_int64().value_unsafe();
        return v >= 0 ? Json(uint64_t(v)) : Json(v);
    }
    case simdjson::dom::element_type::UINT64: return Json(e.get_uint64().value_unsafe());
    case simdjson::dom::element_type::DOUBLE: return Json(e.get_double().value_unsafe());
    case simdjson::dom::element_type::BOOL: return Json(e.get_bool().value_unsafe());
    case simdjson::dom::element_type::NULL_VALUE: return Json(nullptr);
    }
    return Json(nullptr);
}

// The schema text as JSON. simdjson first (nlohmann's parser looks up every
// key of an ordered object linearly: quadratic in an object's size, most of
// the parse on $defs of thousands); what it
// cannot read (a number past 64-bit, invalid JSON) goes to nlohmann, which
// reads such numbers as doubles and names the error.
Json parse_schema(std::string_view text) {
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    if (parser.parse(text.data(), text.size()).get(doc) == simdjson::SUCCESS) return from_simdjson(doc);
    try {
        return Json::parse(text);
    } catch (const std::exception& e) {
        throw GrammarError("", std::string("the schema is not valid JSON: ") + e.what());
    }
}

struct Resources {
    std::map<std::string, const Json*> docs;     // base URI (no fragment) -> resource root
    std::map<std::string, const Json*> anchors;  // "base#name" -> schema
    std::string root_base;                       // the document root's resource
    std::map<std::string, std::set<std::string>> dynamic;  // $dynamicAnchor name -> the resources declaring it
    std::set<std::string> recursive;                       // resources whose root has "$recursiveAnchor": true
};

// Keywords whose value is a schema, an array of schemas, or an object of
// schemas: the positions where $id, $anchor and $ref mean something.
const WordSet kSchemaValued = {
    "items", "additionalItems", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
    "unevaluatedItems", "unevaluatedProperties", "contentSchema"};
const WordSet kSchemaArrays = {"items", "prefixItems", "allOf", "anyOf", "oneOf"};
const WordSet kSchemaMaps = {"properties", "patternProperties", "$defs", "definitions",
                                                        "dependentSchemas", "dependencies"};

// old_draft: draft 3/4 (`id`); ref_only: drafts 3-7, where $ref's
// siblings, $id included, are ignored.
void index_schema(Json& node, const std::string& base_in, bool old_draft, bool ref_only, bool draft_known, Resources& res,
                  uint32_t depth) {
    if (!node.is_object() || depth > 4 * kMaxGrammarNesting) return;
    std::string base = base_in;
    bool resource_root = depth == 0;
    auto id = node.find(old_draft ? "id" : "$id");
    if (id != node.end() && id->is_string() && !(ref_only && node.contains("$ref"sv))) {
        const std::string abs = uri_resolve(base, id->get<std::string>());
        // Without $schema naming the draft, a $ref beside an $id that moves
        // the base means one schema in drafts 6-7 and another in 2019-09 on.
        if (!draft_known && node.contains("$ref"sv) && abs.substr(0, abs.find('#')) != base.substr(0, base.find('#')))
            throw GrammarError("$ref", "'$ref' beside an '$id' that changes the base URI: its target depends on the draft; "
                                       "name the draft in '$schema'");
        const size_t hash = abs.find('#');
        if (id->get<std::string>().rfind('#', 0) != 0) {
            base = abs.substr(0, hash);
            res.docs.emplace(base, &node);
            resource_root = true;
        }
        if (hash != std::string::npos && hash + 1 < abs.size()) res.anchors.emplace(abs, &node);
    }
    const std::string doc = base.substr(0, base.find('#'));
    if (depth == 0) res.root_base = doc;
    if (auto ra = node.find("$recursiveAnchor"sv); resource_root && ra != node.end() && *ra == true) res.recursive.insert(doc);
    for (const char* a : {"$anchor", "$dynamicAnchor"})
        if (auto an = node.find(a); an != node.end() && an->is_string()) {
            res.anchors.emplace(doc + "#" + an->get<std::string>(), &node);
            if (a[1] == 'd') res.dynamic[an->get<std::string>()].insert(doc);
        }
    for (const char* a : {"$ref", "$dynamicRef", "$recursiveRef"})
        if (auto r = node.find(a); r != node.end() && r->is_string()) *r = uri_resolve(base, r->get<std::string>());
    for (auto& [k, v] : node.items()) {
        if (kSchemaValued.count(k)) index_schema(v, base, old_draft, ref_only, draft_known, res, depth + 1);
        if (kSchemaArrays.count(k) && v.is_array())
            for (auto& x : v) index_schema(x, base, old_draft, ref_only, draft_known, res, depth + 1);
        if (kSchemaMaps.count(k) && v.is_object())
            for (auto& [name, x] : v.items()) index_schema(x, base, old_draft, ref_only, draft_known, res, depth + 1);
    }
}

// The schema a $dynamicRef (2020-12) or $recursiveRef (2019-09) names
// where that does not depend on the path that reached it; nullopt where it
// does. Each first resolves as a $ref; only where that target is a
// "bookend" (it declares the same $dynamicAnchor, or "$recursiveAnchor":
// true) does the outermost resource of the dynamic scope that declares one
// win. Evaluation starts at the document root, the outermost resource of
// every scope: if it declares the anchor, it wins; if no other resource
// declares it, the first target is the only one there is.
std::optional<std::string> static_dynamic_target(const std::string& key, const std::string& abs, const Resources& res) {
    const size_t hash = abs.find('#');
    const std::string doc = abs.substr(0, hash), frag = hash == std::string::npos ? "" : abs.substr(hash + 1);
    if (key == "$recursiveRef") {
        if (!frag.empty()) return std::nullopt;  // only "#" has a meaning
        auto d = res.docs.find(doc);
        const bool bookend = d != res.docs.end() && d->second->is_object() && d->second->value("$recursiveAnchor", Json()) == true;
        if (!bookend) return doc + "#";
        if (res.recursive.count(res.root_base)) return res.root_base + "#";
        if (res.recursive.size() == 1) return doc + "#";
        return std::nullopt;
    }
    if (frag.empty() || frag[0] == '/') return abs;  // a pointer: a plain $ref
    auto a = res.anchors.find(abs);
    if (a == res.anchors.end() || a->second->value("$dynamicAnchor", Json()) != frag) return abs;
    auto r = res.anchors.find(res.root_base + "#" + frag);
    if (r != res.anchors.end() && r->second->value("$dynamicAnchor", Json()) == frag) return res.root_base + "#" + frag;
    auto d = res.dynamic.find(frag);
    if (d != res.dynamic.end() && d->second.size() == 1) return abs;
    return std::nullopt;
}

// Each $dynamicRef/$recursiveRef whose target is static becomes a $ref
// (beside a $ref of its own: an allOf part); the others stay, refused by
// name where they constrain. Found first, then changed deepest first: a
// change moves the members of that object only (ordered_json keeps them
// in a vector), never an object found before it. Returns how many changed
// (the index then is stale).
struct DynamicRef {
    Json* node;
    const char* key;
    std::string target;
};
void find_dynamic_refs(Json& node, const Resources& res, uint32_t depth, std::vector<DynamicRef>& out) {
    if (!node.is_object() || depth > 4 * kMaxGrammarNesting) return;
    for (const char* key : {"$dynamicRef", "$recursiveRef"})
        if (auto r = node.find(key); r != node.end() && r->is_string())
            if (auto target = static_dynamic_target(key, r->get<std::string>(), res)) out.push_back({&node, key, *target});
    for (auto& [k, v] : node.items()) {
        if (kSchemaValued.count(k)) find_dynamic_refs(v, res, depth + 1, out);
        if (kSchemaArrays.count(k) && v.is_array())
            for (auto& x : v) find_dynamic_refs(x, res, depth + 1, out);
        if (kSchemaMaps.count(k) && v.is_object())
            for (auto& [name, x] : v.items()) find_dynamic_refs(x, res, depth + 1, out);
    }
}
size_t static_dynamic_refs(Json& root, const Resources& res) {
    std::vector<DynamicRef> found;
    find_dynamic_refs(root, res, 0, found);
    size_t changed = 0;
    for (auto it = found.rbegin(); it != found.rend(); ++it) {
        Json& node = *it->node;
        if (node.contains("allOf"sv) && !node["allOf"].is_array()) continue;  // malformed: refused where compiled
        node.erase(it->key);
        if (!node.contains("$ref"sv)) node["$ref"] = it->target;
        else node["allOf"].push_back(Json{{"$ref", it->target}});  // null becomes an array
        ++changed;
    }
    return changed;
}

// enum/const values checked against their sibling keywords by a grammar
// of their own, which may hold such checks again: at most this deep.
constexpr uint32_t kMaxEnumChecks = 4;

// Grammars the compiler checks values with run over single-byte tokens.
const std::shared_ptr<const TokenVocab>& byte_vocab() {
    static const auto vocab = [] {
        std::vector<std::string> bytes;
        for (int b = 0; b < 256; ++b) bytes.emplace_back(1, char(b));
        bytes.emplace_back();  // end of generation
        return std::make_shared<const TokenVocab>(std::move(bytes), std::vector<int32_t>{256});
    }();
    return vocab;
}

// Does `a` match exactly `text`?
bool byte_match(const std::shared_ptr<Automaton>& a, std::string_view text) {
    Matcher m(a);
    return m.accept_bytes(text) && m.accepting();
}

// The bytes a match of `a` may start with (256: it may be empty).
std::bitset<257> first_bytes(const std::shared_ptr<Automaton>& a) {
    Matcher m(a);
    const auto mask = m.mask();
    std::bitset<257> out;
    for (int b = 0; b <= 256; ++b) out[size_t(b)] = ((*mask)[size_t(b) / 32] >> (b % 32)) & 1u;
    return out;
}

class SchemaCompiler {
public:
    SchemaCompiler(const Json& root, const Resources& res, std::string prefix, std::string& out)
        : root_(root), res_(res), prefix_(std::move(prefix)), out_(out) {}

    // `node` (a schema inside the root) compiled on its own.
    std::string compile_node(const Json& node, const std::string& path) {
        std::string expr = value(node, path, 0);
        write_target_rules();
        if (out_.size() > kSchemaGrammarLimits.text_bytes)
            throw GrammarError("", fmt::format("the schema compiles to a grammar of more than {} bytes", kSchemaGrammarLimits.text_bytes));
        return expr;
    }

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
            throw EmptySchema("false", fmt::format("the schema 'false' at {} matches nothing", at(path)));
        }
        if (!s.is_object()) throw GrammarError("", fmt::format("the schema at {} must be an object or a boolean", at(path)));
        if (unevaluated_words(s)) return merged(s, path);  // flatten() rewrites them (unevaluated())
        check_refused(s, path);
        if (auto n = s.find("not"sv); n != s.end())
            if (auto e = value_beside_not(s, *n, path, depth)) return *e;
        if (auto r = s.find("$ref"sv); r != s.end() && r->is_string() && only_redundant_type(s, *r, path))
            return ref(*r, path);
        const bool any_of = s.contains("anyOf"sv), one_of = s.contains("oneOf"sv);
        if (s.contains("allOf"sv) || (any_of && one_of) || (s.contains("$ref"sv) && constrains_beside(s, "$ref")) ||
            conditional(s))
            return merged(s, path);
        if (auto r = s.find("$ref"sv); r != s.end()) return ref(*r, path);
        if (any_of || one_of) return alternatives(s, any_of ? "anyOf" : "oneOf", one_of && !any_of, path, depth);
        return typed_value(s, path, depth);
    }

private:
    // A schema with `not` (n): nothing matches `not` of a schema that
    // matches everything (EmptySchema); else s without it and a schema of
    // the values that fail n, or s with bounds that leave n's values out.
    // Nothing where `not` is written some other way (with the types).
    std::optional<std::string> value_beside_not(const Json& s, const Json& n, const std::string& path,
                                                uint32_t depth) {
        if (trivial(n) == 1)  // {"not": {}}: "may not appear"
            throw EmptySchema("not", fmt::format("the schema at {} is 'not' of a schema that matches everything", at(path)));
        if (!not_types(n) && trivial(n) < 0 && !not_values(n)) {
            // s without `not`, and a schema of values that fail it.
            auto neg = negate(n, path, 0);
            if (!neg)
                throw GrammarError("not", fmt::format("the JSON-schema keyword 'not' at {} is not supported", at(path)));
            if (neg->is_boolean() && !neg->get<bool>())
                throw EmptySchema("not", fmt::format("the schema at {} is 'not' of a schema that matches everything", at(path)));
            Json copy = s;
            copy.erase("not");
            store_.push_back(Json{{"allOf", Json::array({std::move(copy), std::move(*neg)})}});
            return merged(store_.back(), path);
        }
        if (not_values(n)) {
            Json copy = s;
            copy.erase("not");
            const Json& values = n.contains("enum") ? n["enum"] : Json::array({n["const"]});
            uint64_t longest = 0;
            bool strings = false, null = false;
            for (const auto& v : values) {
                if (v.is_null()) {
                    null = true;
                    continue;
                }
                strings = true;
                const std::string& t = v.get_ref<const std::string&>();
                longest = std::max<uint64_t>(longest, std::count_if(t.begin(), t.end(), [](char c) { return (uint8_t(c) & 0xC0) != 0x80; }));
            }
            if (strings) {
                auto m = copy.find("minLength"sv);
                const uint64_t had = m != copy.end() && m->is_number_unsigned() ? m->get<uint64_t>() : 0;
                copy["minLength"] = std::max(had, longest + 1);
            }
            if (null) copy["not"] = Json{{"type", "null"}};
            store_.push_back(std::move(copy));
            return value(store_.back(), path, depth);
        }
        return std::nullopt;
    }

    // anyOf or oneOf (`key`; one_of_only: oneOf without anyOf).
    std::string alternatives(const Json& s, const char* key, bool one_of_only, const std::string& path,
                             uint32_t depth) {
        // oneOf is compiled as anyOf: where its branches overlap, a value
        // matching two of them is not excluded (docs/http-api.md).
        const Json* branches = &s[key];
        if (auto w = one_of_only ? without_shared_empty(*branches) : std::nullopt) {
            store_.push_back(std::move(*w));
            branches = &store_.back();
        }
        const Json& a = *branches;
        if (!a.is_array() || a.empty())
            throw GrammarError(key, fmt::format("'{}' at {} must be a non-empty array", key, at(path)));
        // Keywords beside it apply to every alternative: each becomes
        // {"allOf": [the keywords beside, the alternative]}.
        Json beside = Json::object();
        if (constrains_beside(s, key))
            for (const auto& [k, v] : s.items())
                if (k != key && k != "$defs" && k != "definitions" && !kAnnotations.count(k)) beside[k] = v;
        std::string alts;
        size_t empty = 0;
        std::optional<EmptySchema> last_empty;
        const std::optional<size_t> folding = folding_;
        for (size_t i = 0; i < a.size(); ++i) {
            const std::string sub = path + "/" + key + "/" + std::to_string(i);
            std::string alt;
            // An alternative no value matches is left out (what its
            // compilation wrote before it found that is complete and
            // unused).
            try {
                if (beside.empty()) {
                    alt = value(a[i], sub, depth + 1);
                } else {
                    store_.push_back(Json{{"allOf", Json::array({beside, a[i]})}});
                    alt = value(store_.back(), sub, depth + 1);
                }
            } catch (const EmptySchema& e) {
                folding_ = folding;
                ++empty;
                last_empty = e;
                continue;
            }
            if (!alt.empty()) alts += (alts.empty() ? "" : " | ") + alt;  // "": a $ref folded into the target
        }
        if (empty == a.size()) throw *last_empty;
        return alts.empty() ? "" : rule(alts);
    }

    // By the schema's types (or its enum/const).
    std::string typed_value(const Json& s, const std::string& path, uint32_t depth) {
        std::vector<std::string> types = types_of(s, path);
        if (s.contains("enum"sv) || s.contains("const"sv)) return enumerated(s, types, path);
        if (types.empty()) return "j-value";
        const bool has_number = std::count(types.begin(), types.end(), "number") != 0;
        std::string alts;
        for (const auto& t : types) {
            std::string e;
            if (t == "string") e = string(s, path);
            else if (t == "number") e = number(s, path, false);
            else if (t == "integer") {
                if (has_number) continue;  // number allows every integer
                e = number(s, path, true);
            } else if (t == "boolean") e = "j-boolean";
            else if (t == "null") e = "j-null";
            else if (t == "object") e = inside([&] { return object(s, path, depth); });
            else if (t == "array") e = inside([&] { return array(s, path, depth); });
            alts += (alts.empty() ? "" : " | ") + e;
        }
        return alts.find(' ') == std::string::npos ? alts : rule(alts);
    }

private:
    static std::string at(const std::string& path) { return path.empty() ? "the root" : "'" + path + "'"; }

    // Refuses what kRefused lists, where it constrains.
    static void check_refused(const Json& s, const std::string& path) {
        for (const auto& [k, v] : s.items()) {
            if (k == "not") continue;  // value(): the forms it enforces (negate()), else refused there
            if (kRefused.count(k)) {
                if ((v.is_object() || v.is_array()) && v.empty() && k != "not") continue;
                if ((k == "unevaluatedProperties" || k == "unevaluatedItems") && trivial(v) == 1) continue;
                throw GrammarError(k, fmt::format("the JSON-schema keyword '{}' at {} is not supported", k, at(path)));
            }
        }
        // A malformed value of an enforced keyword is a 400 even where the
        // keyword would not apply (a string-only keyword on a number ...).
        // (one lookup per key: this runs on every schema of a document)
        static const std::unordered_map<std::string_view, char> kValueKind = {
            {"format", 's'}, {"pattern", 's'}, {"properties", 'o'}, {"patternProperties", 'o'}, {"$defs", 'o'},
            {"definitions", 'o'}, {"dependentRequired", 'o'}, {"required", 'a'}, {"enum", 'a'}, {"prefixItems", 'a'},
            {"minimum", 'n'}, {"maximum", 'n'}, {"multipleOf", 'n'}, {"exclusiveMinimum", 'x'}, {"exclusiveMaximum", 'x'},
            {"minLength", 'u'}, {"maxLength", 'u'}, {"minItems", 'u'}, {"maxItems", 'u'}, {"minProperties", 'u'},
            {"maxProperties", 'u'}};
        for (const auto& [k, v] : s.items()) {
            const auto kind = kValueKind.find(k);
            if (kind == kValueKind.end()) continue;
            const char* want = nullptr;
            switch (kind->second) {
            case 's': want = v.is_string() ? nullptr : "a string"; break;
            case 'o': want = v.is_object() ? nullptr : "an object"; break;
            case 'a': want = v.is_array() ? nullptr : "an array"; break;
            case 'n': want = v.is_number() ? nullptr : "a number"; break;
            case 'x': want = v.is_number() || v.is_boolean() ? nullptr : "a number (or, in draft 4, a boolean)"; break;
            default:
                want = v.is_number_unsigned() ||
                               (v.is_number_float() && v.get<double>() >= 0 && std::floor(v.get<double>()) == v.get<double>())
                           ? nullptr
                           : "a non-negative integer";
            }
            if (want) throw GrammarError(k, fmt::format("'{}' at {} must be {}", k, at(path), want));
        }
        for (const char* key : {"dependentSchemas", "dependencies"})
            if (auto d = s.find(key); d != s.end()) {
                bool ok = d->is_object();
                if (ok)
                    for (const auto& [k, v] : d->items())
                        ok = ok && (v.is_object() || v.is_boolean() || (v.is_array() && std::string_view(key) == "dependencies"));
                if (!ok)
                    throw GrammarError(key, fmt::format("'{}' at {} must be an object of {}", key, at(path),
                                                        std::string_view(key) == "dependencies"
                                                            ? "schemas or lists of names" : "schemas"));
            }
    }

    // if/then/else constrain only with a then or an else.
    static bool conditional(const Json& s) {
        if (s.contains("if"sv) && (s.contains("then"sv) || s.contains("else"sv))) return true;
        return !dependent_schemas(s).empty();
    }

    // dependentSchemas, and draft 4-7's dependencies with a schema: "if this
    // property is present, the schema applies" (as name -> schema).
    static std::vector<std::pair<std::string, const Json*>> dependent_schemas(const Json& s) {
        std::vector<std::pair<std::string, const Json*>> out;
        for (const char* key : {"dependentSchemas", "dependencies"})
            if (auto d = s.find(key); d != s.end() && d->is_object())
                for (const auto& [k, v] : d->items())
                    if (!v.is_array() && trivial(v) != 1) out.emplace_back(k, &v);
        return out;
    }

    // Whether `s` has an enforced keyword other than `except`.
    static bool constrains_beside(const Json& s, std::string_view except) {
        for (const auto& [k, v] : s.items())
            if (k != except && kHandled.count(k)) return true;
        return false;
    }

    // The types the schema allows, in its order; empty for any. Without
    // `type`, the keywords that apply to one type pick it (kObjectWords ...).
    // The types a `not` excludes, when it holds only `type` (and annotations).
    static std::optional<std::set<std::string>> not_types(const Json& n) {
        if (!n.is_object() || !n.contains("type"sv)) return std::nullopt;
        for (const auto& [k, v] : n.items())
            if (k != "type" && (kHandled.count(k) || kRefused.count(k) || k == "if")) return std::nullopt;
        std::set<std::string> out;
        const Json& t = n["type"];
        if (t.is_string()) out.insert(t.get<std::string>());
        else if (t.is_array())
            for (const auto& x : t)
                if (x.is_string()) out.insert(x.get<std::string>());
                else return std::nullopt;
        else return std::nullopt;
        return out;
    }

    // {"not": {"enum": [...]}} or {"not": {"const": x}} over strings and
    // null: enforced by value() (null left out of the types; strings made
    // longer than the longest listed one: narrowed).
    static bool not_values(const Json& n) {
        if (!n.is_object()) return false;
        const Json* values = nullptr;
        Json one;
        for (const auto& [k, v] : n.items()) {
            if (kAnnotations.count(k) || (k == "type" && (v == "string" || v == "null"))) continue;
            if (k == "enum" && v.is_array() && !v.empty()) values = &v;
            else if (k == "const") one = Json::array({v}), values = &one;
            else return false;
        }
        if (!values) return false;
        for (const auto& v : *values)
            if (!v.is_string() && !v.is_null()) return false;
        return true;
    }

    // An enum/const list of numbers only (at most 16, so the intervals
    // between them stay within the anyOf limit), sorted, duplicates removed.
    static std::optional<std::vector<double>> listed_numbers(const Json& values) {
        if (!values.is_array() || values.empty() || values.size() > 16) return std::nullopt;
        std::vector<double> xs;
        for (const auto& v : values) {
            if (!v.is_number()) return std::nullopt;
            xs.push_back(v.get<double>());
        }
        std::sort(xs.begin(), xs.end());
        xs.erase(std::unique(xs.begin(), xs.end()), xs.end());
        return xs;
    }

    // 1: the schema matches every value (true, {}, annotations only); 0: it
    // matches none (false); -1: neither.
    static int trivial(const Json& n) {
        if (n.is_boolean()) return n.get<bool>() ? 1 : 0;
        if (!n.is_object()) return -1;
        for (const auto& [k, v] : n.items())
            if (!kAnnotations.count(k)) return -1;
        return 1;
    }

    static std::vector<std::string> types_of(const Json& s, const std::string& path) {
        std::vector<std::string> types = types_allowed(s, path);
        auto n = s.find("not"sv);
        if (n == s.end() || trivial(*n) == 0) return types;
        const auto ex = not_types(*n);
        if (!ex) return types;  // another `not`: value() negates it where this schema is compiled
        if (types.empty()) types = {"null", "boolean", "object", "array", "number", "string"};
        std::vector<std::string> kept;
        for (const auto& t : types) {
            if (ex->count(t) || (t == "integer" && ex->count("number"))) continue;
            if (t == "number" && ex->count("integer"))
                throw GrammarError("not", fmt::format("'not' of 'integer' beside 'number' at {} is not supported", at(path)));
            kept.push_back(t);
        }
        if (kept.empty()) throw EmptySchema("not", fmt::format("'not' at {} excludes every type the schema allows", at(path)));
        return kept;
    }

    static std::vector<std::string> types_allowed(const Json& s, const std::string& path) {
        std::vector<std::string> types;
        if (auto t = s.find("type"sv); t != s.end()) {
            if (t->is_string()) types.push_back(t->get<std::string>());
            else if (t->is_array() && !t->empty())
                for (const auto& x : *t) {
                    if (!x.is_string()) throw GrammarError("type", fmt::format("'type' at {} must hold strings", at(path)));
                    types.push_back(x.get<std::string>());
                }
            else throw GrammarError("type", fmt::format("'type' at {} must be a string or a non-empty array", at(path)));
            for (const auto& x : types)
                if (x != "string" && x != "number" && x != "integer" && x != "boolean" && x != "null" && x != "object" &&
                    x != "array")
                    throw GrammarError("type", fmt::format("'type' '{}' at {} is not a JSON-schema type",
                                                           x.substr(0, 100), at(path)));
            return types;
        }
        auto any = [&](const std::set<std::string, std::less<>>& words) {
            for (const auto& w : words)
                if (s.contains(w)) return true;
            return false;
        };
        if (any(kObjectWords)) types.push_back("object");
        if (any(kArrayWords)) types.push_back("array");
        if (any(kStringWords)) types.push_back("string");
        if (any(kNumberWords)) types.push_back("number");
        return types;
    }

    // A schema whose values all fail `x`: its negation, or less (narrowed).
    // x is the conjunction of its keywords, so not-x is the union of each
    // keyword's negation: those written here are `type`, `required`,
    // `properties` (that property present, failing its schema), `enum`/
    // `const` of strings and null or of numbers, the length/count/number bounds, `anyOf`
    // (every branch negated), `allOf` and a one-branch `oneOf` (a union),
    // `not` (its schema), `$ref` (its target's). A keyword with no negation
    // here is left out of the union: those values are not written
    // (narrowed). nullopt when no keyword could be negated.
    std::optional<Json> negate(const Json& x, const std::string& path, uint32_t depth) const {
        if (depth > 8) return std::nullopt;
        if (x.is_boolean()) return Json(!x.get<bool>());
        if (!x.is_object()) return std::nullopt;
        if (trivial(x) == 1) return Json(false);
        Json alts = Json::array();
        const bool draft4_bounds = (x.contains("exclusiveMinimum"sv) && x["exclusiveMinimum"].is_boolean()) ||
                                   (x.contains("exclusiveMaximum"sv) && x["exclusiveMaximum"].is_boolean());
        auto of_type = [](const char* type, Json rest) {
            rest["type"] = type;
            return rest;
        };
        for (const auto& [k, v] : x.items()) {
            if (k == "type") {
                if (not_types(Json{{"type", v}})) alts.push_back(Json{{"not", {{"type", v}}}});
            } else if (k == "required" && v.is_array()) {
                for (const auto& r : v)
                    if (r.is_string()) alts.push_back(of_type("object", {{"properties", {{r.get<std::string>(), false}}}}));
            } else if (k == "properties" && v.is_object()) {
                for (const auto& [name, sub] : v.items())
                    if (auto n = negate(sub, path, depth + 1))
                        alts.push_back(of_type("object", {{"required", Json::array({name})}, {"properties", {{name, *n}}}}));
            } else if ((k == "enum" && v.is_array() && !v.empty()) || k == "const") {
                Json one = Json{{k, v}};
                if (not_values(one)) {
                    alts.push_back(Json{{"not", one}});
                } else if (auto xs = listed_numbers(k == "const" ? Json::array({v}) : v)) {
                    // Numbers: every other type, and the open intervals
                    // between the listed values (exact).
                    alts.push_back(Json{{"type", {"string", "boolean", "null", "object", "array"}}});
                    alts.push_back(of_type("number", {{"exclusiveMaximum", xs->front()}}));
                    for (size_t i = 0; i + 1 < xs->size(); ++i)
                        alts.push_back(of_type("number", {{"exclusiveMinimum", (*xs)[i]}, {"exclusiveMaximum", (*xs)[i + 1]}}));
                    alts.push_back(of_type("number", {{"exclusiveMinimum", xs->back()}}));
                } else if (auto others = other_scalars(k == "const" ? Json::array({v}) : v)) {
                    for (auto& o : *others) alts.push_back(std::move(o));
                }
            } else if (k == "not") {
                alts.push_back(v);
            } else if ((k == "minLength" || k == "minItems" || k == "minProperties") && v.is_number_unsigned() &&
                       v.get<uint64_t>() > 0) {
                const char* type = k == "minLength" ? "string" : k == "minItems" ? "array" : "object";
                const std::string max = k == "minLength" ? "maxLength" : k == "minItems" ? "maxItems" : "maxProperties";
                alts.push_back(of_type(type, {{max, v.get<uint64_t>() - 1}}));
            } else if ((k == "maxLength" || k == "maxItems" || k == "maxProperties") && v.is_number_unsigned()) {
                const char* type = k == "maxLength" ? "string" : k == "maxItems" ? "array" : "object";
                const std::string min = k == "maxLength" ? "minLength" : k == "maxItems" ? "minItems" : "minProperties";
                alts.push_back(of_type(type, {{min, v.get<uint64_t>() + 1}}));
            } else if ((k == "minimum" || k == "maximum" || k == "exclusiveMinimum" || k == "exclusiveMaximum") &&
                       v.is_number() && !draft4_bounds) {
                const char* other = k == "minimum" ? "exclusiveMaximum" : k == "maximum" ? "exclusiveMinimum"
                                    : k == "exclusiveMinimum" ? "maximum" : "minimum";
                alts.push_back(of_type("number", {{other, v}}));
            } else if (k == "anyOf" && v.is_array() && !v.empty()) {
                Json all = Json::array();
                for (const auto& sub : v) {
                    auto n = negate(sub, path, depth + 1);
                    if (!n) {
                        all = Json();
                        break;
                    }
                    all.push_back(*n);
                }
                if (!all.is_null()) alts.push_back(Json{{"allOf", all}});
            } else if ((k == "allOf" && v.is_array()) || (k == "oneOf" && v.is_array() && v.size() == 1)) {
                for (const auto& sub : v)
                    if (auto n = negate(sub, path, depth + 1)) alts.push_back(*n);
            } else if (k == "$ref" && v.is_string()) {
                const Json* target = nullptr;
                try {
                    target = resolve(v.get<std::string>(), path);
                } catch (const GrammarError&) {
                    return std::nullopt;
                }
                if (auto n = negate(*target, path, depth + 1)) alts.push_back(*n);
            }
        }
        if (alts.empty()) {
            // Only annotations and unknown keywords: x matches everything.
            for (const auto& [k, v] : x.items())
                if (kHandled.count(k) || kRefused.count(k) || k == "if" || k == "then" || k == "else") return std::nullopt;
            return Json(false);
        }
        return alts.size() == 1 ? alts[0] : Json{{"anyOf", alts}};
    }

    // oneOf branches where two or more are optional_members_only(): `{}`
    // matches each of those, so it is no valid oneOf value, and they get
    // "minProperties": 1 (the only exclusivity enforced; docs/http-api.md).
    // nullopt where nothing changes.
    static std::optional<Json> without_shared_empty(const Json& branches) {
        if (!branches.is_array()) return std::nullopt;
        size_t n = 0;
        for (const auto& b : branches) n += optional_members_only(b);
        if (n < 2) return std::nullopt;
        Json out = branches;
        for (auto& b : out)
            if (optional_members_only(b)) b["minProperties"] = uint64_t(1);
        return out;
    }

    // A plain object schema that surely matches `{}` and writes the same
    // objects but `{}` with "minProperties": 1: no $ref, combinator or
    // condition; no member required; at most 40 listed properties (the
    // counted form's limit, object()), none `false`, or a map; keywords of
    // other types (they constrain no object) and unknown ones beside.
    static bool optional_members_only(const Json& b) {
        if (!b.is_object()) return false;
        bool listed = false, closed = false;
        for (const auto& [k, v] : b.items()) {
            if (kAnnotations.count(k)) continue;
            if (k == "type") {
                if (v != "object" && !(v.is_array() && std::find(v.begin(), v.end(), Json("object")) != v.end()))
                    return false;
            } else if (k == "properties") {
                if (!v.is_object() || v.size() > 40) return false;
                for (const auto& [name, p] : v.items())
                    if (trivial(p) == 0) return false;
                listed = !v.empty();
            } else if (k == "additionalProperties") {
                closed = trivial(v) == 0;
            } else if (k == "required") {
                if (!v.is_array() || !v.empty()) return false;
            } else if (k == "minProperties") {
                if (!v.is_number() || v.get<double>() != 0) return false;
            } else if (k == "maxProperties") {
                if (!v.is_number() || v.get<double>() < 1) return false;
            } else if (kArrayWords.count(k) || kStringWords.count(k) || kNumberWords.count(k)) {
                continue;
            } else if (kHandled.count(k) || kRefused.count(k) || k == "if" || k == "then" || k == "else") {
                return false;
            }
        }
        return listed || !closed;
    }

    // The values outside a list that mixes scalars (booleans, null,
    // strings, numbers; SchemaStore's `enum: [false]`): the types with no
    // listed value, the booleans not listed, strings as not_values() writes
    // them, the intervals between listed numbers (at most 16). Objects and
    // arrays in the list leave their type out (narrowed). nullopt when the
    // list holds nothing negated here.
    static std::optional<std::vector<Json>> other_scalars(const Json& values) {
        if (!values.is_array() || values.empty()) return std::nullopt;
        Json strings = Json::array(), numbers = Json::array();
        std::set<bool> booleans;
        bool null = false;
        std::set<std::string> listed;
        for (const auto& v : values) {
            if (v.is_boolean()) booleans.insert(v.get<bool>()), listed.insert("boolean");
            else if (v.is_null()) null = true, listed.insert("null");
            else if (v.is_string()) strings.push_back(v), listed.insert("string");
            else if (v.is_number()) numbers.push_back(v), listed.insert("number");
            else listed.insert(v.is_object() ? "object" : "array");
        }
        if (booleans.empty() && !null) return std::nullopt;  // the other forms above
        std::vector<Json> out;
        Json free = Json::array();
        for (const char* t : {"null", "boolean", "string", "number", "object", "array"})
            if (!listed.count(t)) free.push_back(t);
        if (!free.empty()) out.push_back(Json{{"type", free}});
        if (booleans.size() == 1) out.push_back(Json{{"const", !*booleans.begin()}});
        if (!strings.empty()) out.push_back(Json{{"type", "string"}, {"not", {{"enum", strings}}}});
        if (auto xs = numbers.empty() ? std::nullopt : listed_numbers(numbers)) {
            out.push_back(Json{{"type", "number"}, {"exclusiveMaximum", xs->front()}});
            for (size_t i = 0; i + 1 < xs->size(); ++i)
                out.push_back(Json{{"type", "number"}, {"exclusiveMinimum", (*xs)[i]}, {"exclusiveMaximum", (*xs)[i + 1]}});
            out.push_back(Json{{"type", "number"}, {"exclusiveMinimum", xs->back()}});
        }
        if (out.empty()) return std::nullopt;
        return out;
    }

    // {"$ref": r, "type": t} where r's target already compiles to types
    // within t (a plain schema, no combinator): the merge would change
    // nothing, and merging copies the target (a large one under each of
    // many properties).
    bool only_redundant_type(const Json& s, const Json& r, const std::string& path) const {
        if (!s.contains("type"sv)) return false;
        for (const auto& [k, v] : s.items())
            if (k != "$ref" && k != "type" && kHandled.count(k)) return false;
        const Json* t = resolve(r.get<std::string>(), path);
        if (!t->is_object()) return false;
        for (const char* k : {"$ref", "allOf", "anyOf", "oneOf", "not", "enum", "const", "if", "dependentSchemas",
                              "dependencies", "$dynamicRef", "$recursiveRef"})
            if (t->contains(k)) return false;
        const auto want = types_allowed(s, path);
        const auto have = types_allowed(*t, path);
        if (have.empty()) return false;
        for (const auto& x : have)
            if (std::find(want.begin(), want.end(), x) == want.end() &&
                !(x == "integer" && std::find(want.begin(), want.end(), "number") != want.end()))
                return false;
        return true;
    }

    static bool has_type(const Json& v, const std::vector<std::string>& types) {
        if (types.empty()) return true;
        for (const auto& t : types) {
            if ((t == "string" && v.is_string()) || (t == "boolean" && v.is_boolean()) || (t == "null" && v.is_null()) ||
                (t == "object" && v.is_object()) || (t == "array" && v.is_array()) ||
                (t == "number" && v.is_number()))
                return true;
            if (t == "integer" && v.is_number() &&
                (v.is_number_integer() || std::floor(v.get<double>()) == v.get<double>()))
                return true;
        }
        return false;
    }

    // enum/const: the values both allow, of the schema's types, each
    // written compactly as given. (Other keywords beside them are not
    // checked against the values: docs/http-api.md.)
    std::string enumerated(const Json& s, const std::vector<std::string>& types, const std::string& path) {
        std::string alts;
        for (const auto& v : enum_values(s, types, path)) alts += (alts.empty() ? "" : " | ") + literal(v.dump());
        return rule(alts);
    }

    // The enum/const values the schema allows (different values only).
    std::vector<Json> enum_values(const Json& s, const std::vector<std::string>& types, const std::string& path) {
        std::vector<Json> values;
        if (auto e = s.find("enum"sv); e != s.end()) {
            if (!e->is_array() || e->empty())
                throw GrammarError("enum", fmt::format("'enum' at {} must be a non-empty array", at(path)));
            values.assign(e->begin(), e->end());
        }
        if (auto c = s.find("const"sv); c != s.end()) {
            if (s.contains("enum"sv) && std::find(values.begin(), values.end(), *c) == values.end()) values.clear();
            else values.assign(1, *c);
        }
        // Other enforced keywords beside them: the values are checked by
        // matching them against those keywords' own grammar.
        Json others = s;
        others.erase("enum");
        others.erase("const");
        if (!others.contains("type"sv)) {
            // Each keyword applies to its own type only: without a `type`,
            // the values' own types (not the types keywords imply) are checked.
            std::set<std::string> kinds;
            for (const auto& v : values)
                kinds.insert(v.is_string() ? "string" : v.is_number() ? "number" : v.is_boolean() ? "boolean"
                             : v.is_null() ? "null" : v.is_array() ? "array" : "object");
            if (!kinds.empty()) others["type"] = Json(std::vector<std::string>(kinds.begin(), kinds.end()));
        }
        std::shared_ptr<Automaton> check;
        if (constrains_beside(others, "type")) {
            if (enum_depth_ >= kMaxEnumChecks)
                throw GrammarError(s.contains("enum"sv) ? "enum" : "const",
                                   fmt::format("'enum'/'const' beside other keywords at {} nest more than {} deep", at(path),
                                               kMaxEnumChecks));
            std::string rules = json_base_rules();
            SchemaCompiler sub(root_, res_, prefix_ + "e" + std::to_string(counter_++) + "-", rules);
            sub.enum_depth_ = enum_depth_ + 1;
            const std::string expr = sub.compile_node(others, path);
            rules += "root ::= " + expr + "\n";
            check = std::make_shared<Automaton>(gbnf_grammar(rules), byte_vocab());
        }
        std::vector<Json> kept;
        for (const auto& v : values)
            if (has_type(v, types) && (!check || byte_match(check, v.dump())) &&
                std::find(kept.begin(), kept.end(), v) == kept.end())
                kept.push_back(v);
        if (kept.empty())
            throw EmptySchema(s.contains("enum"sv) ? "enum" : "const",
                               fmt::format("'{}' at {} allows no value of the schema's type", s.contains("enum"sv) ? "enum" : "const",
                                           at(path)));
        return kept;
    }

    // uniqueItems over a finite item set (enum/const, boolean, null): the
    // items are a subsequence of the values in their listed order
    // (narrowing: other orders are not written), each at most once, lo..hi
    // of them; nullopt when the items are not such a set.
    std::optional<std::string> unique_array(const Json& s, uint64_t lo, uint64_t hi, const std::string& path) {
        auto it = s.find("items"sv);
        if (it == s.end() || it->is_array() || s.contains("prefixItems"sv) || s.contains("contains"sv)) return std::nullopt;
        const Json items = flatten(*it, path + "/items", 0);
        std::vector<Json> values;
        const std::vector<std::string> types = types_of(items, path + "/items");
        if (items.contains("enum"sv) || items.contains("const"sv)) {
            values = enum_values(items, types, path + "/items");
        } else if (!types.empty() && !constrains_beside(items, "type")) {
            for (const auto& t : types) {
                if (t == "boolean") values.insert(values.end(), {Json(true), Json(false)});
                else if (t == "null") values.emplace_back(nullptr);
                else return std::nullopt;
            }
        } else {
            return std::nullopt;
        }
        constexpr size_t kMaxUniqueValues = 64;
        const size_t n = values.size();
        if (n > kMaxUniqueValues) return std::nullopt;
        hi = std::min<uint64_t>(hi, n);
        if (lo > hi)
            throw GrammarError("uniqueItems", fmt::format("'minItems' at {} asks for more different items than the {} "
                                                          "values allowed", at(path), n));
        std::vector<std::string> parts;
        for (const auto& v : values) parts.push_back(literal(v.dump()));
        const std::string items_rule = counted_subsequence(
            parts, std::vector<bool>(n, false), [&](size_t i, uint64_t c) { return c <= hi && c + (n - i) >= lo; },
            fresh());
        return rule(R"("[" j-ws )" + items_rule + R"( "]")");
    }

    // Rules that write a subsequence of `parts`, in their order and separated
    // by commas, counting what they write: state (i, c) is "at part i with c
    // written", a part with `required[i]` cannot be left out, and only
    // states `feasible(i, c)` allows are written (so the count ends where the
    // caller needs it). Rules are named `base`-i-c; returns the start's name.
    std::string counted_subsequence(const std::vector<std::string>& parts, const std::vector<bool>& required,
                                    const std::function<bool(size_t, uint64_t)>& feasible, const std::string& base) {
        const size_t n = parts.size();
        auto state = [&](size_t i, uint64_t c) { return fmt::format("{}-{}-{}", base, i, c); };
        for (size_t i = 0; i <= n; ++i)
            for (uint64_t c = 0; c <= i; ++c) {
                if (!feasible(i, c)) continue;
                std::vector<std::string> alts;
                if (i == n) {
                    alts.emplace_back("");
                } else {
                    if (feasible(i + 1, c + 1))
                        alts.push_back(std::string(c ? R"("," j-ws )" : "") + parts[i] + " j-ws " + state(i + 1, c + 1));
                    if (!required[i] && feasible(i + 1, c)) alts.push_back(state(i + 1, c));
                }
                std::string body;
                for (const auto& a : alts) body += (body.empty() ? "" : " | ") + a;
                out_ += state(i, c) + " ::= " + body + "\n";
            }
        return state(0, 0);
    }

    // A JSON-grammar expression (a patternProperties pattern's keys) as an
    // automaton to check names with; the same pattern on many objects is
    // compiled once.
    const std::shared_ptr<Automaton>& check_automaton(const std::string& expr) {
        auto& a = checks_[expr];
        if (!a) a = std::make_shared<Automaton>(gbnf_grammar(json_base_rules() + "root ::= " + expr + "\n"), byte_vocab());
        return a;
    }

    std::string fresh() { return prefix_ + "s" + std::to_string(counter_++); }
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
        bool empty = false;   // no value matches it (EmptySchema)
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
        return use_target(target_index(target, resolve(target, path), path), path);
    }

    // A schema with $ref and other keywords, or allOf: merged into one
    // schema, compiled as a target named by its text (the same schema met
    // again, in a recursion, is the same rule).
    std::string merged(const Json& s, const std::string& path) {
        // Large texts are keyed by hash and length, so the keys of many
        // nested merged schemas do not hold the document many times over.
        // Annotations beside the parts do not make a different schema
        // (`{"$ref": "#", "description": …}` under each of many properties
        // is one target, not one per property).
        // (the text of s without them, as dump() writes an object: no copy of s)
        std::string key = "{";
        for (const auto& [k, v] : s.items()) {
            if (kAnnotations.count(k)) continue;
            if (key.size() > 1) key += ',';
            key += Json(k).dump() + ':' + v.dump();
        }
        key += '}';
        key = key.size() <= 4096 ? "&" + key : fmt::format("&#{:x}:{}", std::hash<std::string>{}(key), key.size());
        if (auto it = refs_.find(key); it != refs_.end()) return use_target(it->second, path);
        Json flat = flatten(s, path, 0);
        if (auto c = flat.find(kConditionals); c != flat.end()) {
            const Json conds = *c;
            flat.erase(kConditionals);
            for (const auto& cond : conds) apply_conditional(flat, cond, path);
        }
        store_.push_back(std::move(flat));
        return use_target(target_index(key, &store_.back(), path), path);
    }

    std::string use_target(size_t t, const std::string& path) {
        if (targets_[t].empty)
            throw EmptySchema("allOf", fmt::format("the schema at {} matches nothing", at(path)));
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

    // A $ref to a JSON-Schema meta-schema the document does not hold (draft
    // 4/6/7, 2019-09, 2020-12 and their vocabularies: "this value is a
    // schema"): a small schema whose every value is a valid schema in each
    // draft, an object of `type`, `title` and `description` (narrowed: the
    // meta-schema allows any schema); its `title`/`description` properties:
    // a string. Other pointers into it: nullptr (refused as unresolved).
    static const Json* meta_schema(const std::string& doc, const std::string& frag) {
        static const Json kSchema = Json::parse(R"({"type":"object","properties":{
            "type":{"enum":["string","number","integer","boolean","object","array","null"]},
            "title":{"type":"string"},"description":{"type":"string"}},"additionalProperties":false})");
        static const Json kString = Json{{"type", "string"}};
        std::string d = doc;
        if (d.rfind("https://", 0) == 0) d.erase(4, 1);
        bool meta = false;
        for (const char* m : {"http://json-schema.org/draft-04/schema", "http://json-schema.org/draft-06/schema",
                              "http://json-schema.org/draft-07/schema", "http://json-schema.org/draft/2019-09/schema",
                              "http://json-schema.org/draft/2020-12/schema"})
            meta = meta || d == m;
        for (const char* m : {"http://json-schema.org/draft/2019-09/meta/", "http://json-schema.org/draft/2020-12/meta/"})
            meta = meta || (d.rfind(m, 0) == 0 && d.size() > std::string_view(m).size());
        if (!meta) return nullptr;
        if (frag.empty()) return &kSchema;
        if (frag == "/properties/title" || frag == "/properties/description") return &kString;
        return nullptr;
    }

    // The schema a $ref names: "#", or a JSON pointer into the root
    // ("#/$defs/a", "#/properties/x/items", ...).
    const Json* resolve(const std::string& target, const std::string& path) const {
        const size_t hash = target.find('#');
        const std::string doc = target.substr(0, hash), frag = hash == std::string::npos ? "" : target.substr(hash + 1);
        const Json* node = nullptr;
        if (auto d = res_.docs.find(doc); d != res_.docs.end()) node = d->second;
        if (!node)
            if (const Json* m = meta_schema(doc, frag)) return m;
        if (node && !frag.empty() && frag[0] != '/') {
            auto a = res_.anchors.find(doc + "#" + percent_unescape(frag));
            node = a == res_.anchors.end() ? nullptr : a->second;
        } else if (node && !frag.empty()) {
            size_t pos = 1;
            while (node && pos <= frag.size()) {
                const size_t slash = std::min(frag.find('/', pos), frag.size());
                const std::string part = pointer_unescape(percent_unescape(std::string_view(frag).substr(pos, slash - pos)));
                pos = slash + 1;
                if (node->is_object() && node->size() > 16) {
                    // (an ordered object's find is a linear scan: $defs of thousands)
                    auto& index = members_[node];
                    if (index.empty())
                        for (const auto& [k, v] : node->items()) index.emplace(k, &v);
                    auto it = index.find(part);
                    node = it == index.end() ? nullptr : it->second;
                } else if (node->is_object()) {
                    auto it = node->find(part);
                    node = it == node->end() ? nullptr : &*it;
                } else if (node->is_array() && !part.empty() && part.size() < 10 &&
                           part.find_first_not_of("0123456789") == std::string::npos && std::stoul(part) < node->size()) {
                    node = &(*node)[std::stoul(part)];
                } else {
                    node = nullptr;
                }
            }
        }
        if (!node)
            throw GrammarError("$ref", fmt::format("'$ref' '{}' at {} does not name a schema in this document (the root, "
                                                   "a JSON pointer, an $id or an $anchor; nothing is fetched)",
                                                   target.substr(0, 200), at(path)));
        return node;
    }

    // The target's index, compiling it when first named. Its rule names are
    // fixed before its schema is compiled, so a reference inside finds them.
    size_t target_index(const std::string& target, const Json* node, const std::string& path) {
        if (auto it = refs_.find(target); it != refs_.end()) return it->second;
        if (targets_.size() >= kMaxSchemaRefs)
            throw GrammarError("$ref", fmt::format("'$ref' '{}' at {}: a schema's $refs may name at most {} different "
                                                   "schemas", target.substr(0, 200), at(path), kMaxSchemaRefs));
        const size_t t = targets_.size();
        targets_.push_back(Target{target, fresh(), fresh(), {}, "", false});
        refs_[target] = t;
        const std::optional<size_t> saved = std::exchange(folding_, t);
        const std::string where = target[0] == '&' ? path : target;
        std::string body;
        try {
            body = value(*node, where, ++ref_depth_ > kMaxGrammarNesting ? kMaxGrammarNesting + 1 : 0);
        } catch (const EmptySchema&) {
            // Rules written before the compile found that may name this
            // target: they are left unused, but every name must be defined
            // (a rule nothing reaches may never end). A later use is empty too.
            --ref_depth_;
            folding_ = saved;
            targets_[t].empty = true;
            out_ += targets_[t].own + " ::= \"x\" " + targets_[t].own + "\n" + targets_[t].all + " ::= " +
                    targets_[t].own + "\n";
            throw;
        }
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
            if (out_.size() > kSchemaGrammarLimits.text_bytes) return;  // the caller's size check says so
        }
    }

    // ---- Merging $ref and allOf into one schema ----

    // Counts the JSON nodes of `v` against kMaxMergeNodes.
    void charge(const Json& v) {
        size_t n = 0;
        std::vector<const Json*> todo{&v};
        while (!todo.empty()) {
            const Json* j = todo.back();
            todo.pop_back();
            if (++merge_nodes_ > kMaxMergeNodes)
                throw GrammarError("allOf", fmt::format("merging '$ref'/'allOf' schemas copies more than {} JSON values "
                                                        "(the limit)", kMaxMergeNodes));
            if (j->is_structured())
                for (const auto& k : *j) todo.push_back(&k);
            ++n;
        }
    }

    // Draft 4's boolean exclusiveMinimum/exclusiveMaximum as draft 6's
    // numeric form, so bounds merge and compile one way.
    static void normalize_bounds(Json& s) {
        for (auto [ex, bound] : {std::pair{"exclusiveMinimum", "minimum"}, std::pair{"exclusiveMaximum", "maximum"}}) {
            auto e = s.find(ex);
            if (e == s.end() || !e->is_boolean()) continue;
            const bool on = e->get<bool>();
            s.erase(ex);
            if (on && s.contains(bound)) {
                s[ex] = s[bound];
                s.erase(bound);
            }
        }
    }

    // `s` with its $ref and allOf merged in: one schema with neither at its
    // top (they may remain deeper, where they compile on their own).
    Json flatten(const Json& s, const std::string& path, uint32_t depth) {
        if (depth > kMaxGrammarNesting)
            throw GrammarError("allOf", fmt::format("'$ref'/'allOf' at {} nest deeper than {} levels", at(path), kMaxGrammarNesting));
        if (s.is_boolean()) {
            if (s.get<bool>()) return Json::object();
            throw EmptySchema("allOf", fmt::format("the schema 'false' in 'allOf' at {} matches nothing", at(path)));
        }
        if (!s.is_object()) throw GrammarError("", fmt::format("the schema at {} must be an object or a boolean", at(path)));
        if (unevaluated_words(s)) return unevaluated(s, path, depth);
        check_refused(s, path);
        disjoint_types(s, path);
        charge(s);
        Json out = Json::object();
        for (const auto& [k, v] : s.items())
            if (k != "$ref" && k != "allOf" && k != "$defs" && k != "definitions" && k != "if" && k != "then" &&
                k != "else" && !kAnnotations.count(k))
                out[k] = v;
        if (conditional(s)) {  // applied to the whole merged schema (merged())
            Json conds = Json::array();
            if (s.contains("if"sv) && (s.contains("then"sv) || s.contains("else"sv))) {
                Json cond = Json::object();
                for (const char* k : {"if", "then", "else"})
                    if (auto v = s.find(k); v != s.end()) cond[k] = *v;
                conds.push_back(cond);
            }
            for (const auto& [name, sub] : dependent_schemas(s))
                conds.push_back(Json{{"if", {{"required", Json::array({name})}}}, {"then", *sub}});
            out.erase("dependentSchemas");
            if (auto d = out.find("dependencies"sv); d != out.end() && d->is_object()) {
                Json lists = Json::object();
                for (const auto& [k, v] : d->items())
                    if (v.is_array()) lists[k] = v;
                if (lists.empty()) out.erase("dependencies");
                else *d = lists;
            }
            out[kConditionals] = conds;
        }
        normalize_bounds(out);
        if (auto o = out.find("oneOf"sv); o != out.end()) {  // oneOf as anyOf (see value())
            Json alts = without_shared_empty(*o).value_or(*o);
            out.erase("oneOf");
            merge(out, Json{{"anyOf", alts}}, path);
        }
        if (auto r = s.find("$ref"sv); r != s.end()) {
            if (!r->is_string()) throw GrammarError("$ref", fmt::format("'$ref' at {} must be a string", at(path)));
            merge(out, flatten(*resolve(r->get<std::string>(), path), r->get<std::string>(), depth + 1), path);
        }
        if (auto a = s.find("allOf"sv); a != s.end()) {
            if (!a->is_array() || a->empty())
                throw GrammarError("allOf", fmt::format("'allOf' at {} must be a non-empty array", at(path)));
            for (size_t i = 0; i < a->size(); ++i)
                merge(out, flatten((*a)[i], path + "/allOf/" + std::to_string(i), depth + 1), path);
        }
        return out;
    }

    // Whether `s` has an unevaluatedProperties/unevaluatedItems that
    // constrains (true and {} do not).
    static bool unevaluated_words(const Json& s) {
        for (const char* k : {"unevaluatedProperties", "unevaluatedItems"})
            if (auto u = s.find(k); u != s.end() && trivial(*u) != 1) return true;
        return false;
    }

    // unevaluatedProperties / unevaluatedItems, where what is evaluated is
    // known from the schema's text: `s` without them is flattened (its
    // $ref/allOf parts merged, oneOf as anyOf) and its anyOf alternatives
    // are spread out, each merged with the rest into one flat schema. In a
    // flat schema the properties its parts evaluate are its `properties`
    // and `patternProperties` (all of them where it has an
    // additionalProperties), so unevaluatedProperties is its
    // additionalProperties; the items are its tuple (all of them where a
    // schema follows the tuple), so unevaluatedItems is what follows it.
    // A part with an unevaluated* of its own is rewritten first, within its
    // own parts only, as the specification scopes it; afterwards it has
    // evaluated everything. Narrowed: a value two alternatives both match
    // gets the properties/items of one only; if/then/else and
    // dependentSchemas are merged in after (merged()), so what only their
    // branches evaluate is not written (their own properties meet this
    // additionalProperties). Refused: unevaluatedItems beside contains
    // (which items match it varies).
    Json unevaluated(const Json& s, const std::string& path, uint32_t depth) {
        Json rest = s;
        Json up = Json(true), ui = Json(true);
        if (auto u = rest.find("unevaluatedProperties"sv); u != rest.end()) up = *u, rest.erase(u);
        if (auto u = rest.find("unevaluatedItems"sv); u != rest.end()) ui = *u, rest.erase(u);
        const char* key = trivial(up) != 1 ? "unevaluatedProperties" : "unevaluatedItems";
        for (const Json* u : {&up, &ui})
            if (!u->is_boolean() && !u->is_object())
                throw GrammarError(key, fmt::format("'{}' at {} must be a schema", key, at(path)));
        Json flat = flatten(rest, path, depth + 1);
        std::vector<Json> alts;
        spread(std::move(flat), alts, key, path, depth);
        Json out = Json::array();
        for (auto& f : alts) {
            if (trivial(up) != 1 && !f.contains("additionalProperties"sv)) f["additionalProperties"] = up;
            if (trivial(ui) != 1) {
                if (f.contains("contains"sv))
                    throw GrammarError(key, fmt::format("'unevaluatedItems' beside 'contains' at {} is not supported", at(path)));
                auto items = f.find("items"sv);
                if (f.contains("prefixItems"sv)) {
                    if (items == f.end()) f["items"] = ui;
                } else if (items != f.end() && items->is_array()) {
                    if (!f.contains("additionalItems"sv)) f["additionalItems"] = ui;
                } else if (items == f.end()) {
                    f["items"] = ui;
                }
            }
            // Its conditionals now, after the additionalProperties: only
            // merged() applies them, and only at the top, which an anyOf of
            // these is not.
            if (auto c = f.find(kConditionals); c != f.end()) {
                const Json conds = *c;
                f.erase(c);
                for (const auto& cond : conds) apply_conditional(f, cond, path);
            }
            out.push_back(std::move(f));
        }
        if (out.size() == 1) return std::move(out[0]);
        return Json{{"anyOf", std::move(out)}};
    }

    // The flat schemas `flat`'s anyOf alternatives make, each merged with the
    // rest of `flat` (alternatives no value matches left out), at most
    // kMaxMergedAlternatives in all.
    void spread(Json flat, std::vector<Json>& out, const char* key, const std::string& path, uint32_t depth) {
        auto a = flat.find("anyOf"sv);
        if (a == flat.end()) {
            out.push_back(std::move(flat));
            return;
        }
        if (!a->is_array() || a->empty())
            throw GrammarError("anyOf", fmt::format("'anyOf' at {} must be a non-empty array", at(path)));
        const Json alts = *a;
        flat.erase(a);
        std::optional<EmptySchema> last_empty;
        const size_t before = out.size();
        for (size_t i = 0; i < alts.size(); ++i) {
            Json f;
            try {
                f = flatten(Json{{"allOf", Json::array({flat, alts[i]})}}, path + "/anyOf/" + std::to_string(i), depth + 1);
            } catch (const EmptySchema& e) {
                last_empty = e;
                continue;
            }
            spread(std::move(f), out, key, path, depth + 1);
            if (out.size() > kMaxMergedAlternatives)
                throw GrammarError(key, fmt::format("'{}' at {} beside 'anyOf'/'oneOf' makes more than {} alternatives "
                                                    "(the limit)", key, at(path), kMaxMergedAlternatives));
        }
        if (out.size() == before && last_empty) throw *last_empty;
    }

    // The `type`s of `s`, of its $ref's target and of its allOf parts (and
    // theirs), one level each, with nothing in common: the merge matches
    // nothing, found before copying the parts (a large $ref target merged
    // with `{"type": "string"}` under each of many properties).
    void disjoint_types(const Json& s, const std::string& path) const {
        std::optional<std::set<std::string>> common;
        auto meet = [&](const Json& part) {
            if (!part.is_object()) return;
            auto t = part.find("type"sv);
            if (t == part.end()) return;
            std::set<std::string> these;
            if (t->is_string()) these.insert(t->get<std::string>());
            else if (t->is_array())
                for (const auto& x : *t)
                    if (x.is_string()) these.insert(x.get<std::string>());
            if (these.empty()) return;
            if (these.count("number")) these.insert("integer");
            if (!common) {
                common = these;
                return;
            }
            std::set<std::string> both;
            for (const auto& x : *common)
                if (these.count(x)) both.insert(x);
            common = both;
        };
        auto with_target = [&](const Json& part) {
            meet(part);
            if (!part.is_object()) return;
            if (auto r = part.find("$ref"sv); r != part.end() && r->is_string()) {
                try {
                    meet(*resolve(r->get<std::string>(), path));
                } catch (const GrammarError&) {
                    // the merge itself names the reference
                }
            }
        };
        with_target(s);
        if (auto a = s.find("allOf"sv); a != s.end() && a->is_array())
            for (const auto& part : *a) with_target(part);
        if (common && common->empty()) nothing("type", path, "no type is allowed by every part");
    }

    [[noreturn]] static void nothing(const std::string& key, const std::string& path, const std::string& why) {
        throw EmptySchema("allOf", fmt::format("'allOf' at {} matches nothing: {} ('{}')", at(path), why, key));
    }

    // if/then/else on the merged schema `s`: s becomes s AND one of
    //   (if AND then)            the values `if` accepts, and then;
    //   (not-if AND else)        where `if` tests one property against a
    //                            finite set of values (const/enum) and s
    //                            gives that property a finite set too: the
    //                            property present with one of the others.
    // Where not-if is not such a set, the else branch is not written
    // (narrowed: the values `if` rejects are left out).
    void apply_conditional(Json& s, const Json& cond, const std::string& path) {
        Json alts = Json::array();
        const Json& test = cond["if"];
        auto both = [](const Json& x, const Json* y) { return y ? Json{{"allOf", Json::array({x, *y})}} : x; };
        auto branch = [&](const char* k) { return cond.contains(k) ? &cond[k] : nullptr; };
        // `if: {"not": x}` whose x has no negation written here: only the
        // else side (x) is written (narrowed), rather than a refusal.
        const Json* inner = negation_of(test);
        const bool unwritable = inner && !negate(*inner, path, 0);
        if (!(test.is_boolean() && !test.get<bool>()) && !unwritable) alts.push_back(both(test, branch("then")));
        if (test.is_boolean()) {
            if (!test.get<bool>()) alts.push_back(branch("else") ? *branch("else") : Json(true));
        } else if (auto n = negated(test, s, path); n && !n->is_null()) {
            alts.push_back(both(*n, branch("else")));
        }
        merge(s, Json{{"anyOf", alts}}, path);
    }

    // x where `test` is {"not": x} (beside annotations only), else null.
    static const Json* negation_of(const Json& test) {
        if (!test.is_object()) return nullptr;
        const Json* x = nullptr;
        for (const auto& [k, v] : test.items()) {
            if (k == "not") x = &v;
            else if (!kAnnotations.count(k)) return nullptr;
        }
        return x;
    }

    // A schema whose values make `test` fail, within what `s` allows:
    // nullopt where that is not a finite set of values of one property,
    // null where it is empty.
    std::optional<Json> negated(const Json& test, const Json& s, const std::string& path) {
        if (!test.is_object()) return std::nullopt;
        // {"not": x}: x itself (exact); x = false: nothing fails the test.
        if (const Json* x = negation_of(test)) return trivial(*x) == 0 ? Json() : *x;
        // {"required": [a, b]}: a or b is absent (it may not appear).
        if (auto r = test.find("required"sv); r != test.end() && r->is_array() && !r->empty() && !test.contains("properties"sv)) {
            bool only = true;
            for (const auto& [k, v] : test.items())
                if (k != "required" && !kAnnotations.count(k) && !(k == "type" && v == "object")) only = false;
            for (const auto& x : *r) only = only && x.is_string();
            if (only) {
                Json alts = Json::array();
                for (const auto& x : *r) alts.push_back(Json{{"properties", {{x.get<std::string>(), false}}}});
                return alts.size() == 1 ? alts[0] : Json{{"anyOf", alts}};
            }
        }
        const Json* tested = nullptr;
        std::string name;
        for (const auto& [k, v] : test.items()) {
            if (kAnnotations.count(k) || (k == "type" && v == "object")) continue;
            if (k == "properties" && v.is_object() && v.size() == 1) {
                name = v.begin().key();
                tested = &v.begin().value();
                continue;
            }
            if (k == "required" && v.is_array() && v.size() == 1 && test.contains("properties"sv) &&
                test["properties"].is_object() && test["properties"].contains(v[0].is_string() ? v[0].get<std::string>() : ""))
                continue;  // required p beside properties p: not-if also holds when p is absent (not written)
            return std::nullopt;
        }
        if (!tested || !tested->is_object()) return std::nullopt;
        Json tested_values;
        if (auto e = tested->find("enum"); e != tested->end() && e->is_array()) tested_values = *e;
        else if (auto c = tested->find("const"); c != tested->end()) tested_values = Json::array({*c});
        else return std::nullopt;
        auto props = s.find("properties"sv);
        if (props == s.end() || !props->is_object() || !props->contains(name)) return std::nullopt;
        Json domain;
        try {
            domain = flatten((*props)[name], path + "/properties/" + name, 1);
        } catch (const GrammarError&) {
            return std::nullopt;  // the property's own schema is refused where it is compiled
        }
        Json values;
        if (auto e = domain.find("enum"sv); e != domain.end() && e->is_array()) values = *e;
        else if (auto c = domain.find("const"sv); c != domain.end()) values = Json::array({*c});
        else if (domain.value("type", Json()) == "boolean") values = Json::array({true, false});
        else return std::nullopt;
        Json others = Json::array();
        for (const auto& v : values)
            if (std::find(tested_values.begin(), tested_values.end(), v) == tested_values.end()) others.push_back(v);
        if (others.empty()) return Json();
        return Json{{"properties", {{name, {{"enum", others}}}}}, {"required", Json::array({name})}};
    }

    // {"allOf": [x, y]} with nested plain allOfs spread out and repeated
    // parts dropped, so merging recursive schemas reaches a schema it met
    // before (the same merged target) instead of a longer text each level.
    static Json all_of(const Json& x, const Json& y) {
        Json parts = Json::array();
        auto add_one = [&](const Json& p) {
            if (trivial(p) == 1) return;
            Json q = p;
            if (q.is_object())  // annotations do not make a different part
                for (auto it = q.begin(); it != q.end();)
                    it = kAnnotations.count(it.key()) ? q.erase(it) : std::next(it);
            if (std::find(parts.begin(), parts.end(), q) == parts.end()) parts.push_back(std::move(q));
        };
        auto add = [&](const Json& v) {
            if (v.is_object() && v.size() == 1 && v.contains("allOf"sv) && v["allOf"].is_array() && !v["allOf"].empty()) {
                for (const auto& p : v["allOf"]) add_one(p);
            } else {
                add_one(v);
            }
        };
        add(x);
        add(y);
        if (parts.empty()) return Json::object();
        return parts.size() == 1 ? parts[0] : Json{{"allOf", parts}};
    }

    // Properties one side allows beyond its `properties` must match its
    // additionalProperties (absent: any): target's properties that
    // other_side does not name get other_side's additionalProperties
    // (checked before the sides' properties are united).
    void restrict_properties(Json& target, const Json& other_side, const std::string& path) {
        auto ap_it = other_side.find("additionalProperties"sv);
        const Json* ap = ap_it == other_side.end() ? nullptr : &*ap_it;
        if (!ap || (ap->is_boolean() && ap->get<bool>()) || !target.contains("properties"sv)) return;
        auto named_it = other_side.find("properties"sv);
        const Json* named = named_it == other_side.end() || !named_it->is_object() ? nullptr : &*named_it;
        Json& tp = target["properties"];
        if (!tp.is_object()) return;
        Json kept = Json::object();
        for (auto& [k, v] : tp.items()) {
            if (named && named->contains(k)) kept[k] = v;
            else if (ap->is_boolean()) {  // false: this property may not appear
                if (auto r = target.find("required"sv); r != target.end() && r->is_array() &&
                                                      std::find(r->begin(), r->end(), Json(k)) != r->end())
                    nothing("additionalProperties", path, "a required property '" + k.substr(0, 100) + "' is not allowed");
            } else {
                kept[k] = all_of(v, *ap);
            }
        }
        tp = std::move(kept);
    }

    // a := the schema both a and b (flattened) allow, as far as that is one
    // schema; refused by name where it is not.
    void merge(Json& a, const Json& b, const std::string& path) {
        // A tuple (prefixItems, or an array `items`) says which schema
        // `items`/`additionalItems` apply after, in its own schema only.
        auto tuple = [](const Json& x) {
            auto it = x.find("items"sv);
            return x.contains("prefixItems"sv) || (it != x.end() && it->is_array());
        };
        auto items_words = [](const Json& x) {
            return x.contains("items"sv) || x.contains("prefixItems"sv) || x.contains("additionalItems"sv);
        };
        if ((tuple(a) && items_words(b)) || (tuple(b) && items_words(a)))
            throw GrammarError("allOf", fmt::format("'allOf' (or '$ref' with sibling keywords) at {} merges tuple "
                                                    "items with other items, which is not supported", at(path)));
        Json bb = b;
        restrict_properties(a, bb, path);
        restrict_properties(bb, a, path);
        for (const auto& [k, vb] : bb.items()) {
            auto ia = a.find(k);
            if (ia == a.end()) {
                a[k] = vb;
                continue;
            }
            if (*ia != vb) merge_keyword(k, *ia, vb, path);
        }
    }

    // va := what keyword k's two different values, va and vb, both allow.
    void merge_keyword(const std::string& k, Json& va, const Json& vb, const std::string& path) {
        if (k == "type") {
            auto list = [](const Json& t) {
                std::set<std::string> out;
                if (t.is_string()) out.insert(t.get<std::string>());
                else if (t.is_array())
                    for (const auto& x : t)
                        if (x.is_string()) out.insert(x.get<std::string>());
                return out;
            };
            const auto ta = list(va), tb = list(vb);
            Json both = Json::array();
            for (const auto& t : ta) {
                if (tb.count(t)) both.push_back(t);
                else if (t == "integer" && tb.count("number")) both.push_back(t);
                else if (t == "number" && tb.count("integer")) both.push_back("integer");
            }
            if (both.empty()) nothing(k, path, "no type is allowed by every part");
            va = both.size() == 1 ? both[0] : both;
        } else if (k == "properties" && va.is_object() && vb.is_object()) {
            for (const auto& [pk, pv] : vb.items()) {
                if (auto p = va.find(pk); p != va.end()) *p = all_of(*p, pv);
                else va[pk] = pv;
            }
        } else if (k == "required" && va.is_array() && vb.is_array()) {
            for (const auto& x : vb)
                if (std::find(va.begin(), va.end(), x) == va.end()) va.push_back(x);
        } else if ((k == "items" || k == "additionalProperties" || k == "additionalItems") && !va.is_array() &&
                   !vb.is_array()) {
            va = all_of(va, vb);
        } else if ((k == "minLength" || k == "minItems" || k == "minProperties" || k == "minimum" ||
                    k == "exclusiveMinimum") && va.is_number() && vb.is_number()) {
            if (vb.get<double>() > va.get<double>()) va = vb;
        } else if ((k == "maxLength" || k == "maxItems" || k == "maxProperties" || k == "maximum" ||
                    k == "exclusiveMaximum") && va.is_number() && vb.is_number()) {
            if (vb.get<double>() < va.get<double>()) va = vb;
        } else if (k == "enum" && va.is_array() && vb.is_array()) {
            Json both = Json::array();
            for (const auto& x : va)
                if (std::find(vb.begin(), vb.end(), x) != vb.end()) both.push_back(x);
            if (both.empty()) nothing(k, path, "no value is in every 'enum'");
            va = both;
        } else if (k == "const") {
            nothing(k, path, "two different constants");
        } else if (k == "uniqueItems" && va.is_boolean() && vb.is_boolean()) {
            va = va.get<bool>() || vb.get<bool>();
        } else if (k == kConditionals && va.is_array() && vb.is_array()) {
            for (const auto& x : vb) va.push_back(x);
        } else if (k == "anyOf" && va.is_array() && vb.is_array()) {
            // Where the merge is optional (a property not required, an
            // anyOf alternative), it is left out (narrowed), as below.
            if (va.size() * vb.size() > kMaxMergedAlternatives)
                throw EmptySchema("anyOf", fmt::format("merging 'anyOf'/'oneOf' at {} makes more than {} alternatives "
                                                        "(the limit)", at(path), kMaxMergedAlternatives));
            Json prod = Json::array();
            for (const auto& x : va)
                for (const auto& y : vb) {
                    Json xy = all_of(x, y);
                    if (std::find(prod.begin(), prod.end(), xy) == prod.end()) prod.push_back(std::move(xy));
                }
            va = prod;
        } else if (kHandled.count(k)) {
            // Not written, as if it matched nothing: an optional
            // property or an anyOf alternative that is such a merge is
            // left out (narrowed); elsewhere this is the 400.
            throw EmptySchema("allOf", fmt::format("'allOf' (or '$ref' with sibling keywords) at {} has two "
                                                   "different '{}' that cannot be merged", at(path), k));
        }
    }

    // ---- Strings ----

    static uint64_t count_keyword(const Json& s, const char* key, uint64_t dflt, const std::string& path) {
        auto b = s.find(key);
        if (b == s.end()) return dflt;
        if (b->is_number_float() && b->get<double>() >= 0 && std::floor(b->get<double>()) == b->get<double>() &&
            b->get<double>() < 1e18)
            return uint64_t(b->get<double>());
        if (!b->is_number_unsigned())
            throw GrammarError(key, fmt::format("'{}' at {} must be a non-negative integer", key, at(path)));
        return b->get<uint64_t>();
    }

    // x{lo,hi} for a rule x; hi above kMaxRepeat as blocks of kMaxRepeat
    // (the grammar's repeat limit): x{0,n} = b{0,q-1} x{0,999} | b{q} x{0,r}
    // with b = x{1000}, n = 1000q + r; each length is reached one way.
    std::string counted(const std::string& x, uint64_t lo, uint64_t hi, const char* key, const std::string& path) {
        if (lo > kMaxRepeat)
            throw GrammarError(key, fmt::format("'{}' at {} is above the limit of {}", key, at(path), kMaxRepeat));
        if (hi == kRegexUnbounded) return lo ? fmt::format("{}{{{},}}", x, lo) : x + "*";
        if (hi <= kMaxRepeat) return fmt::format("{}{{{},{}}}", x, lo, hi);
        const uint64_t max_hi = uint64_t(kMaxRepeat) * kMaxRepeat;
        if (hi > max_hi) hi = max_hi;  // narrowing: a million characters is past any output
        const uint64_t q = hi / kMaxRepeat, r = hi % kMaxRepeat;
        auto& block = block_rules_[x];
        if (block.empty()) {
            block = fresh();
            out_ += fmt::format("{} ::= {}{{{}}}\n", block, x, kMaxRepeat);
        }
        // Lengths [lo, 999], [1000, 1000(q-1) + 999], [1000q, 1000q + r].
        std::string body;
        if (lo <= kMaxRepeat - 1) body = fmt::format("{}{{{},{}}}", x, lo, kMaxRepeat - 1);
        if (q > 1) body += fmt::format("{}{}{{1,{}}} {}{{0,{}}}", body.empty() ? "" : " | ", block, q - 1, x, kMaxRepeat - 1);
        body += fmt::format("{}{}{{{}}}{}", body.empty() ? "" : " | ", block, q, r ? fmt::format(" {}{{0,{}}}", x, r) : "");
        return rule(body);
    }

    std::string string(const Json& s, const std::string& path) {
        const uint64_t lo = count_keyword(s, "minLength", 0, path);
        const uint64_t hi = count_keyword(s, "maxLength", kRegexUnbounded, path);
        if (hi < lo) throw GrammarError("maxLength", fmt::format("'maxLength' at {} is below 'minLength'", at(path)));
        if (auto p = s.find("pattern"sv); p != s.end()) {
            if (!p->is_string()) throw GrammarError("pattern", fmt::format("'pattern' at {} must be a string", at(path)));
            // The same pattern and bounds met again (a definition's pattern
            // in many properties) is the same rule.
            const std::string key = fmt::format("{}\n{}\n{}", lo, hi, p->get<std::string>());
            if (auto it = pattern_rules_.find(key); it != pattern_rules_.end()) return it->second;
            auto e = regex_grammar(p->get<std::string>(), "j-char", lo, hi);
            if (!e)
                throw GrammarError(s.contains("maxLength"sv) ? "maxLength" : "minLength",
                                   fmt::format("'{}' beside 'pattern' at {} cannot be met by narrowing this pattern "
                                               "(its repeats cannot be cut or raised to fit the length)",
                                               s.contains("maxLength"sv) ? "maxLength" : "minLength", at(path)));
            return pattern_rules_[key] = rule("\"\\\"\" " + *e + " \"\\\"\"");
        }
        if (auto f = s.find("format"sv); f != s.end() && f->is_string()) {
            // The same format and bounds met again is the same rule ("" when
            // the format is not enforced there).
            const std::string key = fmt::format("{}\n{}\n{}", lo, hi, f->get<std::string>());
            auto it = format_rules_.find(key);
            if (it == format_rules_.end()) {
                std::string r;
                const std::string fp = format_pattern(f->get<std::string>());
                // A format whose lengths the length bounds cut is left to them:
                // format is an annotation (2019-09 on); the bounds are enforced.
                if (!fp.empty())
                    if (auto e = regex_grammar(fp, "j-char", lo, hi)) r = rule("\"\\\"\" " + *e + " \"\\\"\"");
                it = format_rules_.emplace(key, std::move(r)).first;
            }
            if (!it->second.empty()) return it->second;
        }
        if (lo == 0 && hi == kRegexUnbounded) return "j-string";
        auto& r = length_rules_[{lo, hi}];
        if (r.empty()) r = rule("\"\\\"\" " + counted("j-char", lo, hi, lo > kMaxRepeat ? "minLength" : "maxLength", path) +
                                " \"\\\"\"");
        return r;
    }

    // ---- Numbers ----

    // Decimal numerals (no leading zeros) of [lo, hi], both of n digits.
    static std::string same_length(const std::string& lo, const std::string& hi) {
        if (lo.empty()) return "";
        if (lo == hi) return "\"" + lo + "\"";
        if (lo[0] == hi[0]) {
            const std::string rest = same_length(lo.substr(1), hi.substr(1));
            return "\"" + lo.substr(0, 1) + "\" " + rest;
        }
        const size_t n = lo.size() - 1;
        const bool lo_zeros = lo.find_first_not_of('0', 1) == std::string::npos;
        const bool hi_nines = hi.find_first_not_of('9', 1) == std::string::npos;
        std::vector<std::string> alts;
        if (!lo_zeros) alts.push_back("\"" + lo.substr(0, 1) + "\" " + same_length(lo.substr(1), std::string(n, '9')));
        const char from = lo_zeros ? lo[0] : char(lo[0] + 1), to = hi_nines ? hi[0] : char(hi[0] - 1);
        if (from <= to) {
            std::string e = from == to ? fmt::format("\"{}\"", from) : fmt::format("[{}-{}]", from, to);
            if (n) e += fmt::format(" [0-9]{{{}}}", n);
            alts.push_back(e);
        }
        if (!hi_nines) alts.push_back("\"" + hi.substr(0, 1) + "\" " + same_length(std::string(n, '0'), hi.substr(1)));
        std::string out;
        for (const auto& a : alts) out += (out.empty() ? "( " : " | ") + a;
        return out + " )";
    }

    // Decimal numerals of the integers in [lo, hi] (lo <= hi <= kMaxIntPart).
    static std::string uint_range(uint64_t lo, uint64_t hi) {
        std::string out;
        uint64_t p = 1;  // 10^(digits-1)
        for (int digits = 1; digits <= 16; ++digits, p *= 10) {
            const uint64_t first = digits == 1 ? 0 : p, last = p * 10 - 1;
            if (last < lo || first > hi) continue;
            out += (out.empty() ? "" : " | ") + same_length(std::to_string(std::max(lo, first)), std::to_string(std::min(hi, last)));
        }
        return "( " + out + " )";
    }

    // A magnitude m (the number without its sign), written I(.F)? with no
    // exponent: a < m (a_ex) or a <= m, and m < b (b_ex) or m <= b, b
    // absent for none; a, b integers. "" when none is allowed.
    // frac: the most fraction digits (16; fewer under multipleOf 10^-k).
    static std::string magnitude(uint64_t a, bool a_ex, std::optional<uint64_t> b, bool b_ex, bool integer,
                                 uint32_t frac = 16) {
        if (frac == 0) integer = true;
        const std::string any_frac = integer ? "" : fmt::format(" ( \".\" [0-9]{{1,{}}} )?", frac);
        const std::string zero_frac = integer ? "" : fmt::format(" ( \".\" \"0\"{{1,{}}} )?", frac);
        // A fraction that is not zero, at most `frac` digits: z zeros, a
        // non-zero digit, then up to frac - z - 1 digits.
        std::string nonzero_frac;
        for (uint32_t z = 0; z < frac; ++z)
            nonzero_frac += fmt::format("{}\"0\"{{{}}} [1-9] [0-9]{{0,{}}}", z ? " | " : "", z, frac - z - 1);
        nonzero_frac = " \".\" ( " + nonzero_frac + " )";
        const uint64_t top = b ? std::min(*b, kMaxIntPart) : kMaxIntPart;
        const bool top_ex = b && *b <= kMaxIntPart ? b_ex : false;
        std::vector<std::string> alts;
        if (a > top) return "";
        if (a == top) {
            if (a_ex || top_ex) return "";
            return fmt::format("\"{}\"{}", a, zero_frac);
        }
        // m's integer part is a (above a when exclusive: a fraction), then
        // a+1 .. top-1 with any fraction, then top (no fraction above it).
        if (!a_ex) alts.push_back(fmt::format("\"{}\"{}", a, any_frac));
        else if (!integer) alts.push_back(fmt::format("\"{}\"{}", a, nonzero_frac));
        if (a + 1 <= top - 1) alts.push_back(uint_range(a + 1, top - 1) + any_frac);
        if (!top_ex) alts.push_back(fmt::format("\"{}\"{}", top, b ? zero_frac : any_frac));
        std::string out;
        for (const auto& x : alts) out += (out.empty() ? "" : " | ") + x;
        return alts.empty() ? "" : "( " + out + " )";
    }

    // Integers divisible by m, at most 16 digits: rules d(r, n) for the
    // remainder r so far and n digits still allowed; only rules from which
    // the remainder can still reach 0 are written (a rule that cannot end
    // would be refused by the grammar).
    std::string multiples(uint64_t m) {
        auto& cached = multiple_rules_[m];
        if (!cached.empty()) return cached;
        const std::string base = fresh();
        constexpr uint32_t kDigits = 16;
        std::vector<std::vector<bool>> ok(kDigits, std::vector<bool>(m, false));  // ok[n][r]
        for (uint32_t n = 0; n < kDigits; ++n)
            for (uint64_t r = 0; r < m; ++r) {
                ok[n][r] = r == 0;
                for (uint64_t d = 0; d < 10 && n && !ok[n][r]; ++d) ok[n][r] = ok[n - 1][(10 * r + d) % m];
            }
        auto name = [&](uint64_t r, uint32_t n) { return fmt::format("{}-{}-{}", base, r, n); };
        // The digits leading from r to each next remainder, as a class.
        auto steps = [&](uint64_t r, uint32_t n, bool first) {
            std::map<uint64_t, std::string> by_next;
            for (uint64_t d = first ? 1 : 0; d < 10; ++d) {
                const uint64_t t = (10 * r + d) % m;
                if (ok[n - 1][t]) by_next[t] += char('0' + d);
            }
            std::string alts;
            for (const auto& [t, ds] : by_next) alts += fmt::format("{}[{}] {}", alts.empty() ? "" : " | ", ds, name(t, n - 1));
            return alts;
        };
        for (uint32_t n = 0; n < kDigits; ++n)
            for (uint64_t r = 0; r < m; ++r) {
                if (!ok[n][r]) continue;
                std::string body = n ? steps(r, n, false) : "";
                if (r == 0) body = body.empty() ? "" : "( " + body + " )?";
                out_ += name(r, n) + " ::= " + body + "\n";
            }
        cached = rule(fmt::format("\"-\"? ( \"0\" | {} )", steps(0, kDigits, true)));
        return cached;
    }

    // ---- Decimal bounds for `number` ----

    // A bound's magnitude as written: integer part and fraction digits
    // (no trailing zeros).
    struct Dec {
        bool neg = false;
        uint64_t ip = 0;
        std::string fr;
    };

    // `x` as its shortest decimal text; nullopt when that has an exponent
    // or more than 16 integer digits (the caller rounds those inward).
    static std::optional<Dec> decimal(double x) {
        std::string t = Json(x).dump();
        if (t.find_first_of("eE") != std::string::npos) return std::nullopt;
        Dec d;
        if (!t.empty() && t[0] == '-') d.neg = true, t.erase(0, 1);
        const size_t dot = t.find('.');
        const std::string ip = t.substr(0, dot);
        if (ip.empty() || ip.size() > 16) return std::nullopt;
        d.ip = std::stoull(ip);
        if (dot != std::string::npos) d.fr = t.substr(dot + 1);
        while (!d.fr.empty() && d.fr.back() == '0') d.fr.pop_back();
        if (d.ip == 0 && d.fr.empty()) d.neg = false;
        return d;
    }

    struct FracBound {
        std::string digits;
        bool strict = false;
    };
    struct FracPart {
        bool end = false;   // the digits may stop here
        std::string alts;   // what may follow ("" for nothing)
    };

    // Fraction digits from position k on, with the digits so far equal to
    // lo's (tl) and/or hi's (th) first k digits; at most maxd digits.
    static FracPart frac_digits(const std::optional<FracBound>& lo, const std::optional<FracBound>& hi, uint32_t k,
                                bool tl, bool th, uint32_t maxd) {
        auto digit = [](const FracBound& b, uint32_t i) { return i < b.digits.size() ? b.digits[i] : '0'; };
        auto rest_zero = [](const FracBound& b, uint32_t i) {
            return i >= b.digits.size() || b.digits.find_first_not_of('0', i) == std::string::npos;
        };
        FracPart p;
        p.end = (!tl || (rest_zero(*lo, k) && !lo->strict)) && (!th || !hi->strict || !rest_zero(*hi, k));
        if (k >= maxd) return p;
        const char l = tl ? digit(*lo, k) : '0', h = th ? digit(*hi, k) : '9';
        std::vector<std::string> alts;
        auto sub = [&](char d, bool ntl, bool nth) {
            const FracPart q = frac_digits(lo, hi, k + 1, ntl, nth, maxd);
            if (q.alts.empty() && !q.end) return;
            std::string e = fmt::format("\"{}\"", d);
            if (!q.alts.empty()) e += q.end ? " ( " + q.alts + " )?" : " ( " + q.alts + " )";
            alts.push_back(e);
        };
        if (tl && th && l == h) {
            sub(l, true, true);
        } else {
            char from = l, to = h;
            if (tl) sub(l, true, false), ++from;
            if (th) sub(h, false, true), --to;
            if (from <= to) {
                std::string e = from == to ? fmt::format("\"{}\"", from) : fmt::format("[{}-{}]", from, to);
                if (k + 1 < maxd) e += fmt::format(" [0-9]{{0,{}}}", maxd - k - 1);
                alts.push_back(e);
            }
        }
        for (const auto& a : alts) p.alts += (p.alts.empty() ? "" : " | ") + a;
        return p;
    }

    // The fraction (with its "." or absent) of a magnitude between lo and
    // hi (fraction bounds; none = 0 / below 1); nullopt when none fits.
    static std::optional<std::string> fraction(const std::optional<FracBound>& lo, const std::optional<FracBound>& hi,
                                               uint32_t maxd) {
        const FracPart p = frac_digits(lo, hi, 0, lo.has_value(), hi.has_value(), maxd);
        if (p.alts.empty()) return p.end ? std::optional<std::string>("") : std::nullopt;
        const std::string e = " \".\" ( " + p.alts + " )";
        return p.end ? " (" + e + " )?" : e;
    }

    // A magnitude m between a (a_ex: above it) and b (b_ex: below it; none:
    // up to the digit limit), written I(.F)? without exponent.
    static std::string dec_magnitude(const Dec& a, bool a_ex, const std::optional<Dec>& b, bool b_ex, uint32_t maxd) {
        uint64_t top = kMaxIntPart;
        std::optional<FracBound> top_frac;  // none: any fraction at the top
        if (b && b->ip <= kMaxIntPart) top = b->ip, top_frac = FracBound{b->fr, b_ex};
        const std::optional<FracBound> a_frac = FracBound{a.fr, a_ex};
        if (a.ip > top) return "";
        std::vector<std::string> alts;
        auto add = [&](const std::string& ip, const std::optional<std::string>& f) {
            if (f) alts.push_back(ip + *f);
        };
        if (a.ip == top) {
            add(fmt::format("\"{}\"", a.ip), fraction(a_frac, top_frac, maxd));
        } else {
            add(fmt::format("\"{}\"", a.ip), fraction(a_frac, std::nullopt, maxd));
            if (a.ip + 1 <= top - 1) add(uint_range(a.ip + 1, top - 1), fraction(std::nullopt, std::nullopt, maxd));
            add(fmt::format("\"{}\"", top), fraction(std::nullopt, top_frac, maxd));
        }
        std::string out;
        for (const auto& x : alts) out += (out.empty() ? "" : " | ") + x;
        return alts.empty() ? "" : "( " + out + " )";
    }

    // `number` between decimal bounds, exact where a bound is a decimal of
    // at most 16 integer digits (others rounded inward).
    std::string bounded_number(std::optional<double> lo, bool lo_ex, std::optional<double> hi, bool hi_ex, uint32_t maxd,
                               const std::string& path) {
        auto dec = [](double x, bool up) {
            if (auto d = decimal(x)) return std::pair{*d, false};
            const double r = up ? std::ceil(x) : std::floor(x);
            const double c = std::max(-1e16 + 1, std::min(1e16 - 1, r));
            return std::pair{Dec{c < 0, uint64_t(std::fabs(c)), ""}, r != x};  // second: rounded (inclusive now)
        };
        std::optional<Dec> l, h;
        if (lo) {
            auto [d, rounded] = dec(*lo, true);
            l = d;
            if (rounded) lo_ex = false;
        }
        if (hi) {
            auto [d, rounded] = dec(*hi, false);
            h = d;
            if (rounded) hi_ex = false;
        }
        std::vector<std::string> alts;
        const bool hi_nonneg = !h || !h->neg;
        if (hi_nonneg && !(h && h->ip == 0 && h->fr.empty() && hi_ex)) {
            const Dec a = l && !l->neg ? *l : Dec{};
            const std::string m = dec_magnitude(a, l && !l->neg ? lo_ex : false, h, hi_ex, maxd);
            if (!m.empty()) alts.push_back(m);
        }
        if (!l || l->neg) {
            const Dec a = h && h->neg ? *h : Dec{};
            const std::string m = dec_magnitude(a, h && h->neg ? hi_ex : true, l, lo_ex, maxd);
            if (!m.empty()) alts.push_back("\"-\" " + m);
        }
        if (alts.empty()) throw GrammarError("minimum", fmt::format("'minimum'/'maximum' at {} allow no number", at(path)));
        std::string out;
        for (const auto& x : alts) out += (out.empty() ? "" : " | ") + x;
        return rule(out);
    }

    // number/integer with bounds: exact digit automata (bounded_number for
    // `number`); bounded numbers have no exponent (narrowing). Bounds past
    // 16 digits are the digit limit.
    std::string number(const Json& s0, const std::string& path, bool integer) {
        Json s = s0;
        normalize_bounds(s);
        std::optional<double> lo, hi;
        bool lo_ex = false, hi_ex = false;
        auto read = [&](const char* key, std::optional<double>& v, bool& ex, bool exclusive, bool upper) {
            auto b = s.find(key);
            if (b == s.end()) return;
            if (!b->is_number()) throw GrammarError(key, fmt::format("'{}' at {} must be a number", key, at(path)));
            const double x = b->get<double>();
            // The stricter of minimum and exclusiveMinimum (maximum ...).
            if (!v || (upper ? x < *v || (x == *v && exclusive) : x > *v || (x == *v && exclusive))) {
                v = x;
                ex = exclusive;
            }
        };
        read("minimum", lo, lo_ex, false, false);
        read("exclusiveMinimum", lo, lo_ex, true, false);
        read("maximum", hi, hi_ex, false, true);
        read("exclusiveMaximum", hi, hi_ex, true, true);
        // multipleOf: 10^-k (0.01 ...) is at most k fraction digits; a
        // positive integer m, integers divisible by m (digit automaton,
        // m <= kMaxMultipleOf, no bounds beside it). Others: a 400.
        uint32_t frac = 16;
        uint64_t modulus = 0;
        if (auto mo = s.find("multipleOf"sv); mo != s.end()) {
            if (!mo->is_number() || mo->get<double>() <= 0)
                throw GrammarError("multipleOf", fmt::format("'multipleOf' at {} must be a positive number", at(path)));
            const double x = mo->get<double>();
            bool decimal = false;
            for (uint32_t k = 0; k <= 16 && !decimal; ++k) {
                const double p = std::pow(10.0, -double(k));
                if (std::fabs(x - p) <= p * 1e-9) decimal = true, frac = k;
            }
            if (decimal) {
                if (frac == 0) integer = true;
            } else if (std::floor(x) == x && x <= double(kMaxMultipleOf)) {
                modulus = uint64_t(x);
                integer = true;  // narrowing for number: only integers are written
            } else {
                throw GrammarError("multipleOf", fmt::format("'multipleOf' {} at {} is not supported (10^-k, or an "
                                                             "integer up to {})", x, at(path), kMaxMultipleOf));
            }
        }
        if (modulus > 1) {
            if (lo || hi)
                throw GrammarError("multipleOf", fmt::format("'multipleOf' beside bounds at {} is not supported", at(path)));
            return multiples(modulus);
        }
        // The same bounds met again (`minimum: 0` on many properties) are
        // the same rule: the digit automata are most of a large schema's
        // grammar otherwise.
        const std::string key = fmt::format("{}|{}|{}{}|{}{}", integer, frac, lo ? fmt::format("{}", *lo) : "-", lo_ex,
                                            hi ? fmt::format("{}", *hi) : "-", hi_ex);
        if (auto it = number_rules_.find(key); it != number_rules_.end()) return it->second;
        std::string expr = bounded(lo, lo_ex, hi, hi_ex, integer, frac, path);
        number_rules_.emplace(key, expr);
        return expr;
    }

    std::string bounded(std::optional<double> lo, bool lo_ex, std::optional<double> hi, bool hi_ex, bool integer,
                        uint32_t frac, const std::string& path) {
        if (!lo && !hi) {
            if (integer) return "j-integer";
            if (frac == 16) return "j-number";
            return rule(fmt::format("\"-\"? j-int ( \".\" [0-9]{{1,{}}} )?", frac));
        }
        if (!integer) return bounded_number(lo, lo_ex, hi, hi_ex, frac, path);
        // Integer bounds: inward rounding; a non-integer bound is never reached.
        constexpr double kBig = 1e17;
        std::optional<int64_t> ilo, ihi;
        if (lo && *lo > -kBig) {
            const double c = std::ceil(*lo);
            if (c != *lo) lo_ex = false;
            ilo = int64_t(std::min(c, kBig));
        }
        if (hi && *hi < kBig) {
            const double f = std::floor(*hi);
            if (f != *hi) hi_ex = false;
            ihi = int64_t(std::max(f, -kBig));
        }
        if (integer) {  // exclusive integer bounds are inclusive ones moved by 1
            if (ilo && lo_ex) ++*ilo, lo_ex = false;
            if (ihi && hi_ex) --*ihi, hi_ex = false;
        }
        if (ilo && ihi && (*ilo > *ihi || (*ilo == *ihi && (lo_ex || hi_ex))))
            throw GrammarError("minimum", fmt::format("'minimum'/'maximum' at {} allow no {}", at(path),
                                                      integer ? "integer" : "number (bounds are rounded to integers)"));
        std::vector<std::string> alts;
        // x >= 0: magnitude from max(lo, 0) to hi.
        if (!ihi || *ihi > 0 || (*ihi == 0 && !hi_ex)) {
            const bool from_lo = ilo && *ilo >= 0;
            const std::string m = magnitude(from_lo ? uint64_t(*ilo) : 0, from_lo && lo_ex,
                                            ihi ? std::optional<uint64_t>(uint64_t(*ihi)) : std::nullopt, hi_ex, integer, frac);
            if (!m.empty()) alts.push_back(m);
        }
        // x < 0: "-" and a magnitude above max(-hi, 0) up to -lo.
        if (!ilo || *ilo < 0) {
            const bool from_hi = ihi && *ihi < 0;
            const std::string m = magnitude(from_hi ? uint64_t(-*ihi) : 0, from_hi ? hi_ex : true,
                                            ilo ? std::optional<uint64_t>(uint64_t(-*ilo)) : std::nullopt, lo_ex, integer, frac);
            if (!m.empty()) alts.push_back("\"-\" " + m);
        }
        if (alts.empty())
            throw GrammarError("minimum", fmt::format("'minimum'/'maximum' at {} allow no number", at(path)));
        std::string out;
        for (const auto& x : alts) out += (out.empty() ? "" : " | ") + x;
        return rule(out);
    }

    // An object's listed properties in order, pointing at the schema's own
    // values (no copy of the subschemas at every level) or at ones this
    // compile made (a required name without a schema, a patternProperties
    // merge). A name erased and set again moves to the end, as in a JSON
    // object.
    class Props {
    public:
        void point(const std::string& k, const Json* v) {
            auto it = index_.find(k);
            if (it != index_.end() && items_[it->second].second) {
                items_[it->second].second = v;
                return;
            }
            index_[k] = items_.size();
            items_.emplace_back(k, v);
        }
        void set(const std::string& k, Json v) {
            own_.push_back(std::move(v));
            point(k, &own_.back());
        }
        void erase(const std::string& k) {
            if (auto it = index_.find(k); it != index_.end()) items_[it->second].second = nullptr;
        }
        const Json* get(const std::string& k) const {
            auto it = index_.find(k);
            return it == index_.end() ? nullptr : items_[it->second].second;
        }
        bool contains(const std::string& k) const { return get(k) != nullptr; }
        bool empty() const {
            return std::none_of(items_.begin(), items_.end(), [](const auto& kv) { return kv.second != nullptr; });
        }
        std::vector<std::string> names() const {
            std::vector<std::string> out;
            for (const auto& [k, v] : items_)
                if (v) out.push_back(k);
            return out;
        }

    private:
        std::vector<std::pair<std::string, const Json*>> items_;  // (nullptr: erased)
        std::unordered_map<std::string, size_t> index_;
        std::deque<Json> own_;
    };

    // What object() reads from an object schema's keywords before it writes
    // rules.
    struct ObjectShape {
        Props props;
        const Json* extra = nullptr;  // additionalProperties' schema
        bool closed = false;          // additionalProperties: false
        std::set<std::string> required;
        const Json* pp = nullptr;            // patternProperties, when it lists any
        std::vector<std::string> key_exprs;  // a key expression per pattern
        std::string key_schema;              // a map's keys, from propertyNames
    };

    std::string object(const Json& s, const std::string& path, uint32_t depth) {
        ObjectShape o;
        object_properties(s, path, o);
        object_patterns(s, path, o);
        object_dependencies(s, path, o);
        if (auto only_empty = object_property_names(s, path, depth, o)) return *only_empty;
        const uint64_t min_p = count_keyword(s, "minProperties", 0, path);
        const uint64_t max_p = count_keyword(s, "maxProperties", kRegexUnbounded, path);
        if (max_p < min_p) throw GrammarError("maxProperties", fmt::format("'maxProperties' at {} is below 'minProperties'", at(path)));
        if (o.props.empty()) return object_map(path, depth, o, min_p, max_p);
        return object_members(path, depth, o, min_p, max_p);
    }

    // properties, additionalProperties and required.
    void object_properties(const Json& s, const std::string& path, ObjectShape& o) {
        Props& props = o.props;
        if (auto p = s.find("properties"sv); p != s.end()) {
            if (!p->is_object()) throw GrammarError("properties", fmt::format("'properties' at {} must be an object", at(path)));
            for (const auto& [k, v] : p->items()) props.point(k, &v);
        }
        if (auto a = s.find("additionalProperties"sv); a != s.end()) {
            if (!a->is_boolean() && !a->is_object())
                throw GrammarError("additionalProperties",
                                   fmt::format("'additionalProperties' at {} must be a boolean or a schema", at(path)));
            if (a->is_boolean() && !a->get<bool>()) o.closed = true;
            else o.extra = &*a;
        }
        if (auto r = s.find("required"sv); r != s.end()) {
            if (!r->is_array()) throw GrammarError("required", fmt::format("'required' at {} must be an array", at(path)));
            for (const auto& x : *r) {
                if (!x.is_string()) throw GrammarError("required", fmt::format("'required' at {} must hold strings", at(path)));
                const std::string name = x.get<std::string>();
                if (!props.contains(name)) {
                    // A required name without a schema: any value, or what
                    // additionalProperties says.
                    if (o.closed)  // no object matches: an anyOf alternative that is this is left out
                        throw EmptySchema("required", fmt::format("'required' at {} names '{}', which "
                                                                  "'additionalProperties': false forbids",
                                                                  at(path), name.substr(0, 100)));
                    props.set(name, o.extra ? *o.extra : Json(true));
                }
                o.required.insert(name);
            }
        }
    }

    // patternProperties: a listed property whose name a pattern matches
    // must match that pattern's schema too; with no listed properties the
    // keys are written from the pattern (one pattern, or patterns that share
    // one schema: a key matching two patterns with different schemas would
    // have to match both, which is not enforced, so that is a 400).
    void object_patterns(const Json& s, const std::string& path, ObjectShape& o) {
        if (auto p = s.find("patternProperties"sv); p != s.end()) {
            if (!p->is_object())
                throw GrammarError("patternProperties", fmt::format("'patternProperties' at {} must be an object", at(path)));
            if (!p->empty()) o.pp = &*p;
        }
        if (!o.pp) return;
        for (const auto& [pattern, sub] : o.pp->items()) {
            const std::string e = *regex_grammar(pattern, "j-char", 0, kRegexUnbounded);
            o.key_exprs.push_back("\"\\\"\" " + e + " \"\\\"\"");
        }
        if (o.props.empty()) return;
        size_t i = 0;
        for (const auto& [pattern, sub] : o.pp->items()) {
            const auto& g = check_automaton(o.key_exprs[i++]);
            for (const auto& name : o.props.names())
                if (byte_match(g, Json(name).dump()))
                    o.props.set(name, Json{{"allOf", Json::array({*o.props.get(name), sub})}});
        }
    }

    // dependentRequired (and draft 4-7 `dependencies` with name lists): each
    // listed property's dependencies are simply required (narrowing: they
    // are written even where it is left out).
    void object_dependencies(const Json& s, const std::string& path, ObjectShape& o) {
        Props& props = o.props;
        std::set<std::string>& required = o.required;
        std::vector<std::pair<std::string, const Json*>> deps;
        for (const char* key : {"dependentRequired", "dependencies"})
            if (auto d = s.find(key); d != s.end() && d->is_object())
                for (const auto& [name, list] : d->items())
                    if (list.is_array() && !list.empty()) deps.emplace_back(name, &list);
        if (deps.empty()) return;
        if (props.empty())
            throw GrammarError("dependentRequired", fmt::format("'dependentRequired'/'dependencies' at {} without "
                                                                "'properties' is not supported", at(path)));
        for (bool changed = true; changed;) {
            changed = false;
            for (const auto& [name, list] : deps) {
                if (!props.contains(name)) continue;
                for (const auto& x : *list) {
                    if (!x.is_string()) throw GrammarError("dependentRequired", fmt::format("'dependentRequired' at {} must list names", at(path)));
                    const std::string dep = x.get<std::string>();
                    if (!props.contains(dep)) {
                        if (o.closed) {
                            props.erase(name);  // its dependency may not appear: neither may it
                            if (required.count(name))
                                throw GrammarError("dependentRequired", fmt::format("'dependentRequired' at {} needs '{}', "
                                                                                    "which 'additionalProperties': false "
                                                                                    "forbids", at(path), dep.substr(0, 100)));
                            changed = true;
                            break;
                        }
                        props.set(dep, o.extra ? *o.extra : Json(true));
                    }
                    changed |= required.insert(dep).second;
                }
            }
        }
    }

    // propertyNames: listed names it refuses are left out (a required one
    // is a 400); a map's keys are written from it (o.key_schema). Returns the
    // rule for `{}` alone when it refuses every listed name.
    std::optional<std::string> object_property_names(const Json& s, const std::string& path, uint32_t depth,
                                                     ObjectShape& o) {
        auto pn = s.find("propertyNames"sv);
        if (pn == s.end() || (pn->is_boolean() && pn->get<bool>()) || (pn->is_object() && pn->empty()))
            return std::nullopt;
        Props& props = o.props;
        if (props.empty()) {
            if (o.pp) throw GrammarError("propertyNames", fmt::format("'propertyNames' beside 'patternProperties' at {} "
                                                                      "is not supported", at(path)));
            store_.push_back(Json{{"allOf", Json::array({*pn, Json{{"type", "string"}}})}});
            o.key_schema = value(store_.back(), path + "/propertyNames", depth + 1);
            return std::nullopt;
        }
        std::string rules = json_base_rules();
        SchemaCompiler sub(root_, res_, prefix_ + "n" + std::to_string(counter_++) + "-", rules);
        sub.enum_depth_ = enum_depth_ + 1;
        if (enum_depth_ >= kMaxEnumChecks)
            throw GrammarError("propertyNames", fmt::format("'propertyNames' at {} nests too deep", at(path)));
        rules += "root ::= " + sub.compile_node(*pn, path + "/propertyNames") + "\n";
        const auto g = std::make_shared<Automaton>(gbnf_grammar(rules), byte_vocab());
        for (const auto& name : props.names()) {
            if (byte_match(g, Json(name).dump())) continue;
            props.erase(name);
            if (o.required.count(name))
                throw GrammarError("propertyNames", fmt::format("'propertyNames' at {} refuses the required name "
                                                                "'{}'", at(path), name.substr(0, 100)));
        }
        if (!props.empty()) return std::nullopt;
        // No listed name is allowed: only {} is written.
        if (count_keyword(s, "minProperties", 0, path))
            throw GrammarError("propertyNames", fmt::format("'propertyNames' at {} refuses every listed "
                                                            "property and 'minProperties' asks for some", at(path)));
        return rule(R"("{" j-ws "}")");
    }

    // No listed properties: a map (any keys, or keys from the patterns or
    // propertyNames; every value matching its schema), or `{}` alone.
    std::string object_map(const std::string& path, uint32_t depth, const ObjectShape& o, uint64_t min_p,
                           uint64_t max_p) {
        const Json* extra = o.extra;
        if (o.closed && !o.pp) {
            if (min_p) throw GrammarError("minProperties", fmt::format("'minProperties' at {} asks for members that "
                                                                       "'additionalProperties': false forbids", at(path)));
            return rule(R"("{" j-ws "}")");
        }
        if (!extra && !o.pp && o.key_schema.empty() && !min_p && max_p == kRegexUnbounded) return "j-object";
        // (The values' rules are written, and checked, even when the keys
        // come from the patterns alone.)
        const std::string v = extra ? value(*extra, path + "/additionalProperties", depth + 1) : "j-value";
        std::string member;
        if (o.pp) {
            const auto m = pattern_member(path, depth, o, min_p);
            if (!m) return rule(R"("{" j-ws "}")");
            member = *m;
        } else {
            const std::string key = o.key_schema.empty() ? "j-string" : o.key_schema;
            member = fmt::format(R"({} j-ws ":" j-ws {} j-ws)", key, v);
        }
        if (max_p == 0) return rule(R"("{" j-ws "}")");
        const std::string more = counted(fmt::format(R"(( "," j-ws {} ))", member), min_p ? min_p - 1 : 0,
                                         max_p == kRegexUnbounded ? max_p : max_p - 1, "maxProperties", path);
        std::string members = member + " " + more;
        if (!min_p) members = "( " + members + " )?";
        return rule(fmt::format(R"("{{" j-ws {} "}}")", members));
    }

    // A map's member with keys only from the patterns: others
    // (additionalProperties) are not written (narrowing). A key written from
    // pattern i may match pattern j too, and must then match j's schema: its
    // value is written from i's schema merged with every other one whose
    // pattern can start with a byte i's can (patterns that start apart, `^/`
    // and `^x-`, never match one key; others are merged: narrowed). Nothing
    // when no pattern's values can be written.
    std::optional<std::string> pattern_member(const std::string& path, uint32_t depth, const ObjectShape& o,
                                              uint64_t min_p) {
        std::vector<std::pair<std::string, const Json*>> pats;
        for (const auto& [pattern, sub] : o.pp->items()) pats.emplace_back(pattern, &sub);
        std::vector<std::bitset<257>> starts;
        for (size_t i = 0; i < pats.size(); ++i) {
            starts.push_back(first_bytes(check_automaton(*regex_grammar(pats[i].first, "j-char", 0, kRegexUnbounded))));
        }
        std::string alts;
        std::optional<EmptySchema> last_empty;
        for (size_t i = 0; i < pats.size(); ++i) {
            Json merged_value = *pats[i].second;
            for (size_t j = 0; j < pats.size(); ++j)
                if (j != i && *pats[j].second != *pats[i].second && (starts[i] & starts[j]).any())
                    merged_value = all_of(merged_value, *pats[j].second);
            store_.push_back(std::move(merged_value));
            try {
                const std::string vi = value(store_.back(), path + "/patternProperties", depth + 1);
                alts += fmt::format(R"({}( {} j-ws ":" j-ws {} j-ws ))", alts.empty() ? "" : " | ", o.key_exprs[i], vi);
            } catch (const EmptySchema& e) {
                last_empty = e;  // keys of this pattern are not written
            }
        }
        if (alts.empty()) {
            if (min_p) throw *last_empty;
            return std::nullopt;
        }
        return rule(alts);
    }

    // Listed properties. Properties beyond `properties` never appear here,
    // whatever additionalProperties allows (narrowing; docs/http-api.md).
    std::string object_members(const std::string& path, uint32_t depth, const ObjectShape& o, uint64_t min_p,
                               uint64_t max_p) {
        std::vector<std::string> kv;
        std::vector<bool> req;
        for (const auto& k : o.props.names()) {
            const Json& v = *o.props.get(k);
            std::string sub;
            try {
                sub = value(v, path + "/properties/" + k, depth + 1);
            } catch (const EmptySchema&) {
                if (o.required.count(k)) throw;
                continue;  // an optional property no value matches is left out (it may not appear)
            }
            kv.push_back(literal(Json(k).dump()) + R"( j-ws ":" j-ws )" + sub);
            req.push_back(o.required.count(k) != 0);
        }
        const std::string base = fresh();
        if (min_p <= o.required.size() && max_p >= kv.size()) return listed_members(base, kv, req);
        return counted_members(path, base, kv, req, o.required.size(), min_p, max_p);
    }

    // Members in order, each required or optional, with no count to meet:
    // first(i): the members from property i on, none written yet; rest(i):
    // the same after at least one (each starts with a comma); member(i):
    // property i and rest(i + 1) (written once for both). (Appended in
    // place: a large schema writes tens of thousands.)
    std::string listed_members(const std::string& base, const std::vector<std::string>& kv,
                               const std::vector<bool>& req) {
        const size_t n = kv.size();
        auto name = [&](const char* kind, size_t i) {
            out_ += base;
            out_ += kind;
            out_ += std::to_string(i);
        };
        // "<kind>i ::= <head> -mi", and "| <kind>(i + 1)" when property i is optional
        auto link = [&](const char* kind, size_t i, std::string_view head) {
            name(kind, i);
            out_ += " ::= ";
            out_ += head;
            name("-m", i);
            if (!req[i]) {
                out_ += " | ";
                name(kind, i + 1);
            }
            out_ += '\n';
        };
        for (size_t i = 0; i <= n; ++i) {
            if (i == n) {
                name("-f", i);
                out_ += " ::= \n";
                name("-r", i);
                out_ += " ::= \n";
                continue;
            }
            name("-m", i);
            out_ += " ::= ";
            out_ += kv[i];
            out_ += " j-ws ";
            name("-r", i + 1);
            out_ += '\n';
            link("-f", i, "");
            link("-r", i, R"("," j-ws )");
        }
        out_ += base + R"( ::= "{" j-ws )" + base + "-f0 \"}\"\n";
        return base;
    }

    // min/maxProperties that the property list does not decide: the rules
    // also count the members written (c), and only states from which the
    // counts can still be met are written.
    std::string counted_members(const std::string& path, const std::string& base, const std::vector<std::string>& kv,
                                const std::vector<bool>& req, size_t n_required, uint64_t min_p, uint64_t max_p) {
        const size_t n = kv.size();
        constexpr size_t kMaxCountedProperties = 40;
        if (n > kMaxCountedProperties)
            throw GrammarError(min_p > n_required ? "minProperties" : "maxProperties",
                               fmt::format("'{}' at {} with more than {} properties is not supported",
                                           min_p > n_required ? "minProperties" : "maxProperties", at(path),
                                           kMaxCountedProperties));
        std::vector<size_t> req_from(n + 1, 0);
        for (size_t i = n; i-- > 0;) req_from[i] = req_from[i + 1] + (req[i] ? 1 : 0);
        auto feasible = [&](size_t i, uint64_t c) {
            return std::max<uint64_t>(c + req_from[i], min_p) <= std::min<uint64_t>(c + (n - i), max_p);
        };
        if (!feasible(0, 0))
            throw GrammarError("minProperties", fmt::format("'minProperties'/'maxProperties' at {} cannot be met with "
                                                            "its properties", at(path)));
        const std::string members = counted_subsequence(kv, req, feasible, base);
        out_ += base + R"( ::= "{" j-ws )" + members + " \"}\"\n";
        return base;
    }

    std::string array(const Json& s, const std::string& path, uint32_t depth) {
        // The tuple (prefixItems, or draft 4-7's array `items`) and what may
        // follow it (items / additionalItems; "" for nothing).
        std::vector<std::string> tuple;
        std::string rest = "j-value";
        const Json* tuple_json = nullptr;
        const char* rest_key = "items";
        if (auto p = s.find("prefixItems"sv); p != s.end()) {
            if (!p->is_array()) throw GrammarError("prefixItems", fmt::format("'prefixItems' at {} must be an array", at(path)));
            tuple_json = &*p;
        } else if (auto it = s.find("items"sv); it != s.end() && it->is_array()) {
            tuple_json = &*it;
            rest_key = "additionalItems";
        }
        if (tuple_json)
            for (size_t i = 0; i < tuple_json->size(); ++i)
                tuple.push_back(value((*tuple_json)[i], path + "/" + (rest_key[0] == 'i' ? "prefixItems/" : "items/") +
                                                            std::to_string(i), depth + 1));
        if (auto r = s.find(rest_key); r != s.end() && !(r->is_array())) {
            if (r->is_boolean() && !r->get<bool>()) rest.clear();
            else rest = value(*r, path + "/" + rest_key, depth + 1);
        }
        const uint64_t lo = count_keyword(s, "minItems", 0, path);
        uint64_t hi = count_keyword(s, "maxItems", kRegexUnbounded, path);
        if (lo > kMaxRepeat) throw GrammarError("minItems", fmt::format("'minItems' at {} is above the limit of {}", at(path), kMaxRepeat));
        if (hi < lo) throw GrammarError("maxItems", fmt::format("'maxItems' at {} is below 'minItems'", at(path)));
        if (hi != kRegexUnbounded && hi > kMaxRepeat) hi = kMaxRepeat;  // narrowed: at most 1,000 items written
        if (auto u = s.find("uniqueItems"sv); u != s.end() && u->is_boolean() && u->get<bool>() && hi > 1) {
            if (auto e = unique_array(s, lo, hi, path)) return *e;
            // Items from an infinite set: distinct items cannot be told apart
            // in a grammar, but an array of at most one item is always
            // unique (narrowed).
            if (lo > 1)
                throw GrammarError("uniqueItems", fmt::format("'uniqueItems': true with 'minItems' above 1 at {} is not "
                                                              "supported (enforced for items from a finite set: enum, "
                                                              "const, boolean, null; otherwise by writing at most one item)",
                                                              at(path)));
            hi = 1;
        }
        if (auto c = s.find("contains"sv); c != s.end()) {
            // contains: the FIRST item matches it (and `items`), so at least
            // one does (narrowing: a match elsewhere is not written).
            if (hi == 0 || tuple_json || rest.empty())
                throw GrammarError("contains", fmt::format("'contains' at {} with a tuple, no items allowed or maxItems 0 "
                                                           "is not supported", at(path)));
            Json both = Json::object();
            both["allOf"] = Json::array({*c});
            if (auto it = s.find("items"sv); it != s.end()) both["allOf"].push_back(*it);
            store_.push_back(std::move(both));
            const std::string first = value(store_.back(), path + "/contains", depth + 1);
            const std::string more = fmt::format(R"(( "," j-ws {} j-ws ))", rest);
            const uint64_t rlo = lo ? lo - 1 : 0;
            const std::string reps = hi == kRegexUnbounded ? (rlo ? fmt::format("{}{{{},}}", more, rlo) : more + "*")
                                                           : fmt::format("{}{{{},{}}}", more, rlo, hi - 1);
            return rule(fmt::format(R"("[" j-ws {} j-ws {} "]")", first, reps));
        }
        if (hi == 0) return rule(R"("[" j-ws "]")");
        const size_t k = tuple.size();
        if (k == 0) {
            if (rest.empty()) {
                if (lo) throw GrammarError("minItems", fmt::format("'minItems' at {} asks for items that '{}': false forbids", at(path), rest_key));
                return rule(R"("[" j-ws "]")");
            }
            const std::string more = fmt::format(R"(( "," j-ws {} j-ws ))", rest);
            std::string reps;
            const uint64_t rlo = lo ? lo - 1 : 0;
            if (hi == kRegexUnbounded) reps = rlo ? fmt::format("{}{{{},}}", more, rlo) : more + "*";
            else reps = fmt::format("{}{{{},{}}}", more, rlo, hi - 1);
            std::string items = fmt::format("{} j-ws {}", rest, reps);
            if (lo == 0) items = "( " + items + " )?";
            return rule(fmt::format(R"("[" j-ws {} "]")", items));
        }
        if (lo > k && rest.empty())
            throw GrammarError("minItems", fmt::format("'minItems' at {} asks for more items than the tuple, and '{}': "
                                                       "false forbids more", at(path), rest_key));
        // after(i): what may follow i items.
        const std::string base = fresh();
        auto after = [&](size_t i) { return fmt::format("{}-a{}", base, i); };
        for (size_t i = 1; i <= k; ++i) {
            std::string body;
            if (i < k && i < hi) {
                body = R"("," j-ws )" + tuple[i] + " j-ws " + after(i + 1);
                if (i >= lo) body = "( " + body + " )?";
            } else if (i == k && !rest.empty() && hi > k) {
                const uint64_t rlo = lo > k ? lo - k : 0;
                const std::string more = fmt::format(R"(( "," j-ws {} j-ws ))", rest);
                body = hi == kRegexUnbounded ? (rlo ? fmt::format("{}{{{},}}", more, rlo) : more + "*")
                                             : fmt::format("{}{{{},{}}}", more, rlo, hi - k);
            }
            out_ += after(i) + " ::= " + body + "\n";
        }
        std::string items = tuple[0] + " j-ws " + after(1);
        if (lo == 0) items = "( " + items + " )?";
        return rule(fmt::format(R"("[" j-ws {} "]")", items));
    }

    uint32_t enum_depth_ = 0;  // enum checks this compiler is nested in
    const Json& root_;
    const Resources& res_;
    std::string prefix_;
    std::string& out_;
    size_t counter_ = 0;
    uint32_t ref_depth_ = 0;
    std::unordered_map<std::string, size_t> refs_;  // target (or "&" + a merged schema's text) -> index in targets_
    std::deque<Json> store_;               // merged schemas (stable addresses)
    size_t merge_nodes_ = 0;
    std::map<std::string, std::string> format_rules_, block_rules_, pattern_rules_;
    std::map<uint64_t, std::string> multiple_rules_;
    std::map<std::string, std::string> number_rules_;  // number(): bounds -> expression
    std::map<std::string, std::shared_ptr<Automaton>> checks_;  // check_automaton()
    // resolve(): the members of large objects a pointer passes through, by name.
    mutable std::unordered_map<const Json*, std::unordered_map<std::string, const Json*>> members_;
    std::map<std::pair<uint64_t, uint64_t>, std::string> length_rules_;
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
    Json root = parse_schema(schema_json);
    Resources res;
    std::string schema_uri;
    if (auto sc = root.find("$schema"sv); root.is_object() && sc != root.end() && sc->is_string()) schema_uri = sc->get<std::string>();
    const bool old_draft = schema_uri.find("draft-04"sv) != std::string::npos || schema_uri.find("draft-03"sv) != std::string::npos;
    res.docs.emplace("", &root);
    bool ref_only = old_draft;
    for (const char* d : {"draft-06", "draft-07"}) ref_only = ref_only || schema_uri.find(d) != std::string::npos;
    index_schema(root, "", old_draft, ref_only, schema_uri.find("json-schema.org"sv) != std::string::npos, res, 0);
    if (!ref_only && static_dynamic_refs(root, res) > 0) {  // index again: the changes moved nodes
        res = Resources{};
        res.docs.emplace("", &root);
        index_schema(root, "", old_draft, ref_only, true, res, 0);
    }
    const std::string expr = SchemaCompiler(root, res, prefix, out).compile();
    if (out.size() > kSchemaGrammarLimits.text_bytes)
        throw GrammarError("", fmt::format("the schema compiles to a grammar of more than {} bytes", kSchemaGrammarLimits.text_bytes));
    return expr;
}

}  // namespace eh::constrain::detail

namespace eh::constrain {

std::shared_ptr<const Grammar> json_schema_grammar(std::string_view schema_json) {
    std::string rules = detail::json_base_rules();
    const std::string expr = detail::schema_rules(schema_json, "x-", rules);
    rules += "root ::= j-ws " + expr + "\n";
    return detail::lower(detail::parse_gbnf(rules, detail::kSchemaGrammarLimits), "root", detail::kSchemaGrammarLimits);
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
    return detail::lower(detail::parse_gbnf(rules, detail::kSchemaGrammarLimits), "root", detail::kSchemaGrammarLimits);
}

}  // namespace eh::constrain
