// `--model REF` for every command: a local path as given, a hub reference
// (hf://ORG/REPO/FILE, ORG/REPO[:QUANT]) pulled into the hub cache first,
// with progress on stderr. docs/pull.md.
#pragma once

#include <string>

#include "eh/hub/pull.hpp"

namespace eh::cli {

// The hub settings from the environment; `offline` (a command's --offline)
// forces the cache-only mode HF_HUB_OFFLINE=1 also selects.
hub::PullOptions pull_options(bool offline);

// The local path `ref` names, pulling it when it is a hub reference.
std::string resolve_model_ref(const std::string& ref, bool offline);

}  // namespace eh::cli
