#pragma once

#include <filesystem>
#include <string>

#include "eh/error.hpp"

namespace eh {

// The whole file as bytes. Throws eh::Error(`code`) "cannot read '<path>'".
std::string read_text_file(const std::filesystem::path& path, Code code = Code::ModelLoadFailed);

}  // namespace eh
