#include "serve_announce.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <httplib.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <regex>

namespace eh::cli {

bool post_callback(const std::string& url, const nlohmann::json& body, std::string& err) {
    static const std::regex re(R"(^(https?)://([^/:]+|\[[^\]]+\])(?::(\d+))?(/.*)?$)");
    std::smatch m;
    if (!std::regex_match(url, m, re)) {
        err = "not an http(s) URL";
        return false;
    }
    std::string base = m[1].str() + "://" + m[2].str() + (m[3].matched ? ":" + m[3].str() : "");
    std::string path = m[4].matched ? m[4].str() : "/";
    httplib::Client client(base);
    client.set_connection_timeout(10, 0);
    client.set_read_timeout(10, 0);
    auto res = client.Post(path, body.dump(), "application/json");
    if (!res) {
        err = "request failed: " + httplib::to_string(res.error());
        return false;
    }
    if (res->status < 200 || res->status >= 300) {
        err = fmt::format("HTTP {}", res->status);
        return false;
    }
    return true;
}

std::string advertised_host(const std::string& host) {
    if (host != "0.0.0.0" && host != "::" && !host.empty()) return host;
    std::string found = "127.0.0.1";
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) != 0) return found;
    for (ifaddrs* a = list; a; a = a->ifa_next) {
        if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || !(a->ifa_flags & IFF_UP) || (a->ifa_flags & IFF_LOOPBACK))
            continue;
        char buf[INET_ADDRSTRLEN];
        if (::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf)) {
            found = buf;
            break;
        }
    }
    ::freeifaddrs(list);
    return found;
}

}  // namespace eh::cli
