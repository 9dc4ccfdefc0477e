// Reads small files that name plugins (manifests) without trusting them to be
// files: a FIFO, a device or a directory is refused before any read can
// block, and the size is capped before anything is allocated.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace eh::loader {

// A manifest is a few hundred bytes; 64 KiB leaves room and bounds memory.
inline constexpr size_t kMaxManifestBytes = 64 * 1024;

// The whole file, or nullopt with `problem` set to a sentence naming the
// path and the reason (not a regular file, too large, unreadable).
std::optional<std::string> read_regular_file(const std::string& path, size_t max_bytes, std::string& problem);

}  // namespace eh::loader
