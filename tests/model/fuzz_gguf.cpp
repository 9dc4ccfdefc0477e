// libFuzzer target: arbitrary bytes through the GGUF reader, then through
// everything that reads a ModelFile (describe, inspect). The only acceptable
// failure is eh::Error(ModelLoadFailed); anything else escapes and libFuzzer
// reports it, as it does every ASan finding.
#include <cstdint>
#include <cstdlib>

#include "eh/error.hpp"
#include "eh/model/descriptor.hpp"
#include "eh/model/inspect.hpp"
#include "eh/model/model_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        auto f = eh::model::ModelFile::open_gguf_buffer(data, size, "fuzz.gguf");
        eh::model::InspectOptions o;
        o.list_tensors = true;
        (void)eh::model::inspect_json(*f, o);
        (void)eh::model::inspect_text(*f, o);
        uint64_t sum = 0;
        for (const eh_tensor& t : f->tensors())
            if (t.nbytes) sum += static_cast<const uint8_t*>(t.data)[t.nbytes - 1];
        (void)sum;
    } catch (const eh::Error& e) {
        // Typed getters in describe() may reject a wrong-typed key; both are clean errors.
        if (e.code() != eh::Code::ModelLoadFailed) std::abort();
    }
    return 0;
}
