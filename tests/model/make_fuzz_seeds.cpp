// Writes the fuzzer's seed corpus (small GGUFs made by GgufWriter) into the
// directory given as argv[1].
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "gguf_test_files.hpp"
#include "lora_fuzz_base.hpp"

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s <corpus-dir>\n", argv[0]);
        return 2;
    }
    std::filesystem::path dir(argv[1]);
    std::filesystem::create_directories(dir);
    auto put = [&](const char* name, const std::vector<uint8_t>& b) {
        std::ofstream(dir / name, std::ios::binary).write(reinterpret_cast<const char*>(b.data()),
                                                          static_cast<std::streamsize>(b.size()));
    };
    using namespace eh::model::testing;
    put("small.gguf", small_model_bytes());
    put("small_align64.gguf", small_model_bytes(64));
    put("empty.gguf", Bytes().header(3, 0, 0).b);
    put("one_tensor.gguf", Bytes().header(3, 1, 1).kv_str("general.architecture", "llama")
                               .tensor_info("t", {32, 2}, EH_TYPE_Q8_0, 0).pad().zeros(68).b);
    // LoRA adapters that fit fuzz_lora's base (eh_fuzz_lora reads this corpus too).
    put("lora_f32.gguf", lora_fuzz_seed_bytes(EH_TYPE_F32, 4, true));
    put("lora_f16.gguf", lora_fuzz_seed_bytes(EH_TYPE_F16, 8, false));
    put("lora_q8.gguf", lora_fuzz_seed_bytes(EH_TYPE_Q8_0, 32, true));
    return 0;
}
