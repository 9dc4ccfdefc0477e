// Reads small files named on a command line or by a plugin directory
// (manifests, --chat-template-file) without trusting them to be files: a
// FIFO, a device or a directory is refused before any read can block, and
// the size is capped before anything is allocated.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace eh {

// The whole file, or nullopt with `problem` set to a sentence naming the
// path and the reason (not a regular file, too large, unreadable).
std::optional<std::string> read_regular_file(const std::string& path, size_t max_bytes, std::string& problem);

}  // namespace eh
