// Many models per server (model_pool.hpp): POST /v1/models/load and
// /v1/models/unload, also at llama-server's /models/load and /models/unload,
// with {"model": NAME}. Behind the API key like every POST.
#include <simdjson.h>

#include "eh/http/model_pool.hpp"
#include "impl.hpp"

namespace eh::http {
namespace {

// {"model": "NAME"}: the name, or a RequestError-style 400.
std::string model_field(const std::string& body) {
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    if (parser.parse(body).get(doc) != simdjson::SUCCESS || !doc.is_object())
        throw Error(Code::InvalidRequest, "the body must be a JSON object {\"model\": NAME}");
    std::string_view name;
    if (doc["model"].get(name) != simdjson::SUCCESS || name.empty())
        throw Error(Code::InvalidRequest, "'model' must be a non-empty string naming a served model");
    return std::string(name);
}

}  // namespace

void Server::Impl::install_models() {
    // Both routes: the gates, the body's name, and for a one-model server
    // (no pool) the 404 of a name it does not serve; then `act`.
    auto route = [this](auto act) {
        return [this, act](const httplib::Request& req, httplib::Response& res) {
            const std::string cid = correlation_id(req, res);
            if (!accepting(*this, res, cid)) return;
            const auto pool = get_pool();
            try {
                const std::string name = model_field(req.body);
                if (!pool)
                    if (std::string why = unknown_model(get_info(), name); !why.empty()) throw Error(Code::NotFound, why);
                act(pool.get(), name, res);
            } catch (const std::exception& e) {
                send_exception(res, e, cid);
            }
        };
    };
    auto load = route([this](ModelPool* pool, const std::string& name, httplib::Response& res) {
        if (!pool) {
            send_json(res, 200, {{"model", get_info().model}, {"status", "loaded"}});
            return;
        }
        pool->acquire(name);  // waits for the load like a request; 503 MODEL_LOADING past the wait
        send_json(res, 200, {{"model", pool->find(name)->name}, {"status", "loaded"}});
    });
    auto unload = route([](ModelPool* pool, const std::string& name, httplib::Response& res) {
        if (!pool)
            throw Error(Code::InvalidRequest,
                        "this server serves one model (--model PATH) and cannot unload it; serve several with "
                        "--model NAME=PATH or --models-dir");
        const bool was_loaded = pool->unload(name);
        // Unloading: its running requests finish first, new ones load it again.
        send_json(res, 200, {{"model", pool->find(name)->name}, {"status", was_loaded ? "unloading" : "not_loaded"}});
    });
    http.Post("/v1/models/load", load);
    http.Post("/models/load", load);
    http.Post("/v1/models/unload", unload);
    http.Post("/models/unload", unload);
}

}  // namespace eh::http
