// libFuzzer target: arbitrary bytes through the GGUF reader, then through the
// LoRA adapter reader (engine_host/lora_adapter.hpp) against a fixed small
// base model. The only acceptable failures are eh::Error(ModelLoadFailed)
// from the GGUF reader and ehp::Error MODEL_LOAD_FAILED / UNSUPPORTED from
// the adapter reader; anything else aborts, as every ASan finding does.
#include <cstdint>
#include <cstdlib>
#include <memory>

#include <engine_host/lora_adapter.hpp>

#include "eh/error.hpp"
#include "eh/model/model_file.hpp"
#include "lora_fuzz_base.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const auto base_bytes = eh::model::testing::lora_fuzz_base_bytes();
    static const auto base = eh::model::ModelFile::open_gguf_buffer(base_bytes.data(), base_bytes.size(), "base.gguf");
    std::unique_ptr<eh::model::ModelFile> f;
    try {
        f = eh::model::ModelFile::open_gguf_buffer(data, size, "fuzz.gguf");
    } catch (const eh::Error& e) {
        if (e.code() != eh::Code::ModelLoadFailed) std::abort();
        return 0;
    }
    try {
        const ehp::LoraAdapterInfo info = ehp::read_lora_adapter(f->view(), base->view());
        uint64_t sum = 0;
        for (const ehp::LoraPair& p : info.pairs) {
            if (!p.a || !p.b || !p.w || p.rank == 0 || p.rank > ehp::kMaxLoraRank) std::abort();
            for (const eh_tensor* t : {p.a, p.b})
                if (t->nbytes) sum += static_cast<const uint8_t*>(t->data)[t->nbytes - 1];
        }
        (void)sum;
    } catch (const ehp::Error& e) {
        if (e.status() != EH_MODEL_LOAD_FAILED && e.status() != EH_UNSUPPORTED) std::abort();
    }
    return 0;
}
