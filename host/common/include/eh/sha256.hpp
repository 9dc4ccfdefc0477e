#pragma once

#include <string>

namespace eh {

// Lower-case hex SHA-256 of a file's bytes (OpenSSL). Throws eh::Error
// (NotFound) when the file cannot be read.
std::string sha256_file_hex(const std::string& path);

}  // namespace eh
