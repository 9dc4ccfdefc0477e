#include "parse/constraint_fields.hpp"

#include <fmt/format.h>

namespace eh::http::json {

OutputConstraint get_response_format(const object& obj) {
    OutputConstraint c;
    c.field = "response_format";
    auto rf = field(obj, "response_format");
    if (!rf) return c;
    if (rf->type() != element_type::OBJECT)
        throw RequestError("response_format", fmt::format("'response_format' must be an object, not {}", type_name(rf->type())));
    const object o = rf->get_object().value_unsafe();
    auto t = get_string(o, "type");
    if (!t) throw RequestError("response_format", "'response_format.type' is required");
    if (*t == "text") return c;
    if (*t == "json_object") {
        c.kind = OutputConstraint::Kind::JsonObject;
        return c;
    }
    if (*t != "json_schema")
        throw RequestError("response_format", fmt::format("'response_format.type' must be text, json_object or "
                                                          "json_schema; got '{}'", t->substr(0, 32)));
    auto js = field(o, "json_schema");
    if (!js || js->type() != element_type::OBJECT)
        throw RequestError("response_format", "'response_format.json_schema' must be an object with a 'schema'");
    const object jo = js->get_object().value_unsafe();
    // `name` is only a label and the schema is enforced whatever `strict`
    // says; both are type-checked so a mistake is not silently accepted.
    if (auto n = field(jo, "name"); n && n->type() != element_type::STRING)
        throw RequestError("response_format", "'response_format.json_schema.name' must be a string");
    if (auto s = field(jo, "strict"); s && s->type() != element_type::BOOL)
        throw RequestError("response_format", "'response_format.json_schema.strict' must be a boolean");
    auto schema = field(jo, "schema");
    if (!schema) throw RequestError("response_format", "'response_format.json_schema.schema' is required");
    if (schema->type() != element_type::OBJECT && schema->type() != element_type::BOOL)
        throw RequestError("response_format", fmt::format("'response_format.json_schema.schema' must be an object, not {}",
                                                          type_name(schema->type())));
    c.kind = OutputConstraint::Kind::JsonSchema;
    c.text = simdjson::minify(*schema);
    return c;
}

OutputConstraint get_native_constraint(const object& obj) {
    OutputConstraint c;
    auto g = field(obj, "grammar");
    auto s = field(obj, "json_schema");
    if (g && s) throw RequestError("grammar", "give at most one of 'grammar' and 'json_schema'");
    if (g) {
        if (g->type() != element_type::STRING)
            throw RequestError("grammar", fmt::format("'grammar' must be a string, not {}", type_name(g->type())));
        c.kind = OutputConstraint::Kind::Grammar;
        c.field = "grammar";
        c.text = std::string(g->get_string().value_unsafe());
    } else if (s) {
        if (s->type() != element_type::OBJECT && s->type() != element_type::BOOL)
            throw RequestError("json_schema", fmt::format("'json_schema' must be an object, not {}", type_name(s->type())));
        c.kind = OutputConstraint::Kind::JsonSchema;
        c.field = "json_schema";
        c.text = simdjson::minify(*s);
    }
    return c;
}

}  // namespace eh::http::json
