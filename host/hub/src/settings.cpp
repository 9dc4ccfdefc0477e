#include "eh/hub/settings.hpp"

#include <algorithm>
#include <cstdlib>
#include <fstream>

namespace eh::hub {
namespace {

bool truthy(std::string v) {
    std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    return v == "1" || v == "true" || v == "yes" || v == "on";
}

std::string trim(std::string s) {
    const char* ws = " \t\r\n";
    s.erase(0, s.find_first_not_of(ws));
    s.erase(s.find_last_not_of(ws) + 1);
    return s;
}

}  // namespace

Settings settings_from_env(const GetEnv& getenv) {
    namespace fs = std::filesystem;
    auto get = [&](const char* name) -> std::string {
        auto v = getenv(name);
        return v ? *v : std::string();
    };
    Settings s;
    if (std::string e = get("HF_ENDPOINT"); !e.empty()) {
        while (!e.empty() && e.back() == '/') e.pop_back();
        s.endpoint = e;
    }
    fs::path hf_home;
    if (std::string h = get("HF_HOME"); !h.empty()) hf_home = h;
    else if (std::string x = get("XDG_CACHE_HOME"); !x.empty()) hf_home = fs::path(x) / "huggingface";
    else hf_home = fs::path(get("HOME").empty() ? "/tmp" : get("HOME")) / ".cache" / "huggingface";
    if (std::string c = get("HF_HUB_CACHE"); !c.empty()) s.cache = c;
    else s.cache = hf_home / "hub";

    s.token = trim(get("HF_TOKEN"));
    if (s.token.empty()) {
        fs::path tf = get("HF_TOKEN_PATH").empty() ? hf_home / "token" : fs::path(get("HF_TOKEN_PATH"));
        std::ifstream in(tf);
        std::string line;
        if (in && std::getline(in, line)) s.token = trim(line);
    }
    s.offline = truthy(get("HF_HUB_OFFLINE"));
    return s;
}

Settings settings_from_env() {
    return settings_from_env([](const char* n) -> std::optional<std::string> {
        const char* v = std::getenv(n);
        return v ? std::optional<std::string>(v) : std::nullopt;
    });
}

}  // namespace eh::hub
