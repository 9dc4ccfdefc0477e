#include <fmt/format.h>
#include "eh/error.hpp"
#include "model_data.hpp"
namespace eh::model::detail {
void read_hf_directory(ModelData&, const std::string& dir) {
    throw Error(Code::ModelLoadFailed, fmt::format("'{}': Hugging Face directories are not supported yet", dir));
}
}  // namespace eh::model::detail
