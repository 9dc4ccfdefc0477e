// ABI 1.6's image calls of llama-cuda, added to the shared CUDA glue's table
// (ehcuda::PluginGlue): image_encoder_load (by the projector's type: Gemma
// 3's, ehcuda::Gemma3Vision, or Qwen2.5-VL's on a qwen2vl model,
// ehcuda::QwenVlVision; another type is refused by name, EH_UNSUPPORTED),
// image_encode (a fixed-size encoder), image_encode_sized (1.8: an encoder
// of a nonzero tile, Qwen2.5-VL's), and seq_embd_spans (images.hpp).
#pragma once

#include <memory>
#include <string>

#include <engine_host/plugin_abi.hpp>

#include <engine_host/mmproj.hpp>

#include <ehcuda/vision_gemma3.hpp>
#include <ehcuda/vision_qwen.hpp>

namespace llama_cuda {

template <class Glue>
struct ImageCalls {
    static eh_status image_encoder_load(eh_model* m, const eh_model_view* view, eh_image_encoder_info* out) {
        if (!m) return EH_INVALID_ARGUMENT;
        return ehp::guard(Glue::model_error(), [&] {
            if (!view || !out) throw ehp::Error(EH_INVALID_ARGUMENT, "image_encoder_load: NULL argument");
            auto& box = *Glue::M(m);
            if (box.m->vision || box.m->qwen_vision)
                throw ehp::Error(EH_INVALID_ARGUMENT, "image_encoder_load: an encoder is already loaded");
            if (box.batch) box.batch->expect_idle("image_encoder_load");
            cudaSetDevice(box.m->device);
            const uint32_t text = uint32_t(box.m->cfg.n_embd);
            if (ehp::mmproj::projector_type(ehp::ModelView(view)) == "qwen2.5vl_merger") {
                // (its rows go on a grid of M-RoPE positions: a decoder without
                // them would read the image on one axis)
                if (!box.m->cfg.mrope.active())
                    throw ehp::Error(EH_UNSUPPORTED, "image_encoder_load: the qwen2.5vl_merger projector (Qwen2.5-VL) "
                                                     "needs a qwen2vl model, not " + box.m->cfg.arch);
                box.m->qwen_vision = std::make_unique<ehcuda::QwenVlVision>(view, text, &box.m->ledger);
                ehp::fill_versioned(out, [&](eh_image_encoder_info& i) { i = box.m->qwen_vision->info(); });
                return;
            }
            box.m->vision = std::make_unique<ehcuda::Gemma3Vision>(view, text, &box.m->ledger);
            ehp::fill_versioned(out, [&](eh_image_encoder_info& i) { i = box.m->vision->info(); });
        });
    }
    static eh_status image_encode(eh_model* m, const float* pixels, float* out_rows) {
        if (!m) return EH_INVALID_ARGUMENT;
        return ehp::guard(Glue::model_error(), [&] {
            if (!pixels || !out_rows) throw ehp::Error(EH_INVALID_ARGUMENT, "image_encode: NULL argument");
            auto& box = *Glue::M(m);
            if (box.m->qwen_vision)
                throw ehp::Error(EH_INVALID_ARGUMENT, "image_encode: the encoder takes images of their own size "
                                                      "(image_encode_sized)");
            if (!box.m->vision)
                throw ehp::Error(EH_INVALID_ARGUMENT, "image_encode: no encoder loaded (image_encoder_load)");
            if (box.batch) box.batch->expect_idle("image_encode");
            cudaSetDevice(box.m->device);
            box.m->vision->encode(pixels, out_rows);
        });
    }
    static eh_status image_encode_sized(eh_model* m, const float* pixels, uint32_t width, uint32_t height,
                                        float* out_rows) {
        if (!m) return EH_INVALID_ARGUMENT;
        return ehp::guard(Glue::model_error(), [&] {
            if (!pixels || !out_rows) throw ehp::Error(EH_INVALID_ARGUMENT, "image_encode_sized: NULL argument");
            auto& box = *Glue::M(m);
            if (!box.m->qwen_vision)
                throw ehp::Error(EH_INVALID_ARGUMENT, box.m->vision ? "image_encode_sized: the encoder takes images of one "
                                                                      "size (image_encode)"
                                                                    : "image_encode_sized: no encoder loaded "
                                                                      "(image_encoder_load)");
            if (box.batch) box.batch->expect_idle("image_encode_sized");
            cudaSetDevice(box.m->device);
            box.m->qwen_vision->encode(pixels, width, height, out_rows);
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
        t.image_encode_sized = image_encode_sized;
        t.seq_embd_spans = seq_embd_spans;
        return t;
    }
};

}  // namespace llama_cuda
