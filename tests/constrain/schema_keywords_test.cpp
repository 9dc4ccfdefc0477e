// JSON Schema keywords beyond OpenAI's strict subset (issue 51): what is
// ignored, merged, enforced and refused. Each enforced keyword: valid
// instances match byte by byte, invalid ones stop where they become invalid.
#include <gtest/gtest.h>

#include "constrain_test_util.hpp"

namespace eh::constrain {
namespace {

using test::matches;
using test::prefix_ok;

}  // namespace
}  // namespace eh::constrain
