#include "web_assets.hpp"

#include <fmt/format.h>

#include "impl.hpp"

namespace eh::http::web {

const Asset* find_asset(std::string_view path) {
    if (path == "/") path = "/index.html";
    for (size_t i = 0; i < kAssetCount; ++i)
        if (kAssets[i].path == path) return &kAssets[i];
    return nullptr;
}

void serve_asset(const httplib::Request& req, httplib::Response& res) {
    const std::string cid = correlation_id(req, res);
    const Asset* a = find_asset(req.path);
    if (!a) {
        send_error(res, 404, "NOT_FOUND", fmt::format("no route GET {}", req.path), cid);
        return;
    }
    // Everything the page loads comes from this server: no CDN, no inline code.
    res.set_header("Content-Security-Policy",
                   "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:");
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_header("Cache-Control", "no-cache");
    res.set_content(a->body.data(), a->body.size(), std::string(a->content_type));
}

}  // namespace eh::http::web

namespace eh::http {

void install_web_page(Server::Impl& s) { s.http.Get(web::kRoutePattern, web::serve_asset); }

}  // namespace eh::http
