#include "eh/tools/quantize.hpp"

#include <filesystem>

#include <fmt/format.h>

#include <engine_host/quant_blocks.hpp>
#include <engine_host/tensor_types.h>

#include "eh/error.hpp"
#include "eh/model/gguf_writer.hpp"
#include "eh/model/model_file.hpp"
#include "eh/tools/parallel.hpp"
#include "eh/tools/vocab.hpp"
#include "row_stream.hpp"

namespace eh::tools {

namespace fs = std::filesystem;
using model::GgufValue;

QuantizeResult quantize_file(const QuantizeOptions& o) {
    auto log = [&](const std::string& s) { if (o.log) o.log(s); };
    auto mf = model::ModelFile::open(o.in);
    if (mf->format() != EH_FORMAT_GGUF)
        throw Error(Code::InvalidRequest, fmt::format("quantize: '{}' is not a GGUF file (use `convert` for HF directories)", o.in));

    ModelFacts facts;
    facts.n_layer = static_cast<uint32_t>(mf->get_uint(mf->arch_key("block_count")).value_or(0));
    facts.has_output = mf->find_tensor("output.weight") != nullptr;

    model::GgufWriter w;
    for (const auto& kv : mf->metadata()) {
        const std::string key(model::to_sv(kv.key));
        if (key == "general.alignment" || key == "general.quantization_version") continue;
        if (key == "general.file_type") continue;
        w.set(key, to_gguf_value(kv.value));
    }
    w.set("general.file_type", GgufValue::u32(o.target.file_type()));
    w.set("general.quantization_version", GgufValue::u32(2));

    WorkerPool pool(o.threads);
    QuantizeResult r;
    for (const eh_tensor& t : mf->tensors()) {
        const std::string name(model::to_sv(t.name));
        std::vector<uint64_t> dims(t.dims, t.dims + t.n_dims);
        const uint32_t out_type = choose_type(o.target, facts, name, dims, t.type);
        const char* tn = eh_tensor_type_traits(out_type).name;
        ++r.census[tn ? tn : fmt::format("type#{}", out_type)];
        if (out_type == t.type) {
            w.add_tensor(name, t.type, dims, t.data);  // copied as it is
            continue;
        }
        if (!ehp::quant::can_dequantize(t.type))
            throw Error(Code::InvalidRequest, fmt::format("quantize: tensor '{}' has type {}, which cannot be converted",
                                                          name, model::tensor_type_name(t.type)));
        uint64_t rows = 1;
        for (size_t d = 1; d < dims.size(); ++d) rows *= dims[d];
        const uint64_t ne0 = dims[0];
        const uint64_t in_rb = ehp::quant::row_bytes(t.type, ne0);
        const auto* src = static_cast<const uint8_t*>(t.data);
        w.add_tensor(name, out_type, dims, [&pool, name, out_type, ne0, rows, in_rb, src, in_type = t.type,
                                            &log](model::ByteSink& sink) {
            log(fmt::format("{} {} -> {}", name, model::tensor_type_name(in_type), model::tensor_type_name(out_type)));
            detail::stream_rows(name, out_type, ne0, rows, pool, sink, [&](uint64_t first, uint64_t n, float* out) {
                for (uint64_t r = 0; r < n; ++r)
                    ehp::quant::dequantize_row(in_type, src + (first + r) * in_rb, out + r * ne0, ne0);
            });
        });
    }
    w.write(o.out);
    r.n_tensors = mf->tensors().size();
    r.in_bytes = mf->file_size();
    r.out_bytes = fs::file_size(o.out);
    return r;
}

}  // namespace eh::tools
