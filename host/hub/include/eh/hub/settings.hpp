// Where the hub is and where its cache lives, from the same environment
// variables the Hugging Face tools read, so they share one cache.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>

namespace eh::hub {

struct Settings {
    std::string endpoint = "https://huggingface.co";  // HF_ENDPOINT, no trailing '/'
    std::string token;                                // HF_TOKEN, else the token file; "" = anonymous
    std::filesystem::path cache;                      // the hub cache root (models--ORG--REPO/ live here)
    bool offline = false;                             // HF_HUB_OFFLINE: the cache only, no network
};

// Reads the environment through `getenv` (tests pass their own):
//   cache:   HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub,
//            else ~/.cache/huggingface/hub
//   token:   HF_TOKEN, else the file HF_TOKEN_PATH, else $HF_HOME/token
//   offline: HF_HUB_OFFLINE set to 1, true, yes or on (any case)
using GetEnv = std::function<std::optional<std::string>(const char*)>;
Settings settings_from_env(const GetEnv& getenv);
Settings settings_from_env();  // the process environment

}  // namespace eh::hub
