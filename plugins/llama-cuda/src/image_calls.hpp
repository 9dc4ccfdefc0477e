// ABI 1.6's image calls of llama-cuda, added to the shared CUDA glue's table
// (ehcuda::PluginGlue): image_encoder_load (Gemma 3's projector only:
// ehcuda::Gemma3Vision; another type is refused by name, EH_UNSUPPORTED),
// image_encode, and seq_embd_spans (images.hpp). image_encode_sized (1.8)
// stays NULL: it is only for an encoder of a nonzero tile (Qwen2.5-VL).
#pragma once

#include <memory>
#include <string>

#include <engine_host/plugin_abi.hpp>

#include <ehcuda/vision_gemma3.hpp>

namespace llama_cuda {

template <class Glue>
struct ImageCalls {
    static eh_status image_encoder_load(eh_model* m, const eh_model_view* view, eh_image_encoder_info* out) {
        if (!m) return EH_INVALID_ARGUMENT;
        return ehp::guard(Glue::model_error(), [&] {
            if (!view || !out) throw ehp::Error(EH_INVALID_ARGUMENT, "image_encoder_load: NULL argument");
            auto& box = *Glue::M(m);
            if (box.m->vision) throw ehp::Error(EH_INVALID_ARGUMENT, "image_encoder_load: an encoder is already loaded");
            if (box.batch) box.batch->expect_idle("image_encoder_load");
            cudaSetDevice(box.m->device);
            box.m->vision = std::make_unique<ehcuda::Gemma3Vision>(view, uint32_t(box.m->cfg.n_embd), &box.m->ledger);
            ehp::fill_versioned(out, [&](eh_image_encoder_info& i) { i = box.m->vision->info(); });
        });
    }
    static eh_status image_encode(eh_model* m, const float* pixels, float* out_rows) {
        if (!m) return EH_INVALID_ARGUMENT;
        return ehp::guard(Glue::model_error(), [&] {
            if (!pixels || !out_rows) throw ehp::Error(EH_INVALID_ARGUMENT, "image_encode: NULL argument");
            auto& box = *Glue::M(m);
            if (!box.m->vision)
                throw ehp::Error(EH_INVALID_ARGUMENT, "image_encode: no encoder loaded (image_encoder_load)");
            if (box.batch) box.batch->expect_idle("image_encode");
            cudaSetDevice(box.m->device);
            box.m->vision->encode(pixels, out_rows);
        });
    }
    static eh_status seq_embd_spans(eh_seq* s, const eh_embd_span* spans, uint32_t n_spans) {
        if (!s) return EH_INVALID_ARGUMENT;
        return Glue::on_model(s->owner, "seq_embd_spans", [&](typename Glue::ModelBox& box) {
            box.batch->expect_idle("seq_embd_spans");
            if (n_spans && !spans) throw ehp::Error(EH_INVALID_ARGUMENT, "seq_embd_spans: spans is NULL");
            box.batch->set_spans(Glue::Q(s), spans, n_spans);
        });
    }

    // The glue's table with the image group filled in.
    static eh_plugin_api table(eh_plugin_api t) {
        t.image_encoder_load = image_encoder_load;
        t.image_encode = image_encode;
        t.seq_embd_spans = seq_embd_spans;
        return t;
    }
};

}  // namespace llama_cuda
