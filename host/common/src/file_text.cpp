#include "eh/file_text.hpp"

#include <fstream>
#include <sstream>

namespace eh {

std::string read_text_file(const std::filesystem::path& path, Code code) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(code, "cannot read '" + path.string() + "'");
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) throw Error(code, "cannot read '" + path.string() + "'");
    return ss.str();
}

}  // namespace eh
