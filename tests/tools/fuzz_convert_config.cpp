// libFuzzer target: arbitrary bytes as the config.json of a real tiny
// Hugging Face directory (the llama3 reference model's weights and
// tokenizer, tests/reference/data/llama3/hf) through `engine-host convert`
// (every model_type branch, the key readers, rope scaling, the expert and
// vocabulary checks). The only acceptable failure is an eh::Error; any
// other exception escapes and libFuzzer reports it, as it does a crash, a
// sanitizer finding or memory past -rss_limit_mb (a config that makes the
// converter allocate by a number in it).
//   build-fuzz/bin/fuzz_convert_config /tmp/corpus tests/tools/fuzz_convert_seeds -max_total_time=600
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "eh/error.hpp"
#include "eh/tools/convert.hpp"

namespace fs = std::filesystem;

namespace {

// The directory the inputs become config.json of, made once per process.
const fs::path& work_dir() {
    static const fs::path dir = [] {
        const fs::path src = fs::path(EH_SOURCE_DIR) / "tests/reference/data/llama3/hf";
        const fs::path d = fs::temp_directory_path() / ("eh_fuzz_convert_" + std::to_string(::getpid()));
        fs::create_directories(d);
        for (const char* f : {"model.safetensors", "tokenizer.json"})
            fs::copy_file(src / f, d / f, fs::copy_options::overwrite_existing);
        return d;
    }();
    return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const fs::path& dir = work_dir();
    {
        std::ofstream out(dir / "config.json", std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    }
    eh::tools::ConvertOptions o;
    o.hf_dir = dir.string();
    o.out = (dir / "out.gguf").string();
    o.target = eh::tools::parse_quant_target("F32");
    o.threads = 1;
    try {
        eh::tools::convert_hf(o);
    } catch (const eh::Error&) {
        // the clear, stable refusal
    }
    return 0;
}
