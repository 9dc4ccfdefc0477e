// Checks that keep a browser page from driving a local engine-host (issue
// 26, item 12): DNS rebinding (the Host header), cross-site "simple" POSTs
// that need no CORS preflight, and which Origins --cors trusts.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace eh::http {

// An Origin of exactly scheme://host[:port] with scheme http or https and
// host localhost, 127.0.0.1 or [::1]; nothing else (no user info, no path).
bool local_origin(std::string_view origin);

// Whether a Host header value may reach the routes. Always: IP literals
// (v4, or v6 in brackets) and "localhost", with any port; the host the
// server is bound to; and each of `allowed` ("*" allows any). A name that
// resolves to this machine through someone else's DNS is refused.
bool host_allowed(std::string_view host_header, const std::string& bound_host, const std::vector<std::string>& allowed);

// Whether a POST with this Content-Type is one a web page can send
// cross-site without a preflight and must therefore be refused on the JSON
// routes: text/plain and multipart/form-data always; form-urlencoded when
// the request carries an Origin (browsers always send one; `curl -d`, whose
// default type it is, does not).
bool cross_site_form_post(std::string_view content_type, bool has_origin);

// Whether the media type is application/x-www-form-urlencoded (curl -d's
// default; parameters and case ignored).
bool form_content_type(std::string_view content_type);

}  // namespace eh::http
