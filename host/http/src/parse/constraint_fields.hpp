// The request fields that constrain the output: OpenAI's response_format
// and the native API's grammar / json_schema. Only parsed here (the schema
// or grammar kept as text); the service compiles them when the job is
// submitted, so every refusal is still a 400 naming the field.
#pragma once

#include "parse/json_fields.hpp"

namespace eh::http::json {

// response_format: {type: text | json_object | json_schema, json_schema:
// {name, schema, strict, description}}.
OutputConstraint get_response_format(const object& obj);
// Native: "grammar" (grammar text) or "json_schema" (a schema object); at
// most one of them.
OutputConstraint get_native_constraint(const object& obj);

}  // namespace eh::http::json
