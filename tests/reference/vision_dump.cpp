// eh_vision_dump: what a plugin's image encoder and step give for one image,
// for tests/reference/vision_conformance.py (against transformers).
//
//   eh_vision_dump PLUGIN.so MODEL MMPROJ PIXELS TOKENS FIRST OUT [WIDTH HEIGHT]
//
// MODEL and MMPROJ are GGUF files (eh::model::ModelFile); PIXELS a file of
// 3 x H x W little-endian float32, already normalised (H, W the encoder's
// size, or WIDTH x HEIGHT for an encoder that takes each image at its own
// size: ABI 1.8's tile, image_encode_sized, Qwen2.5-VL); TOKENS a
// comma-separated id list whose positions FIRST ..
// FIRST + n_tokens - 1 are the image's (their ids are the image token's).
// OUT gets little-endian: u32 n_tokens, u32 n_embd, the encoder's rows
// (n_tokens x n_embd float32), u32 vocab, the logits after the last token
// (one step over all tokens, the image's span flagged as the encoder asks:
// BIDIRECTIONAL for Gemma 3, GRID of WIDTH / tile columns for Qwen2.5-VL),
// then the same logits with the image's rows replaced by zeros (a control:
// they must differ), and for a grid span the logits with the image at
// one-axis positions (no EH_SPAN_GRID; none for other spans).
// Exit status: 0 written; 1 any failure (the message on stderr).

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.h>

#include <eh/model/model_file.hpp>

#include "dump_tool.hpp"

namespace {

const eh_plugin_api& open_plugin(const char* path) {
    const eh_plugin_api& api = dump_tool::open_plugin(path);
    if (api.abi_minor < 6 || !api.image_encoder_load || !api.image_encode || !api.seq_embd_spans)
        throw std::runtime_error("the plugin takes no images (ABI 1.6 image_encoder_load)");
    return api;
}

void check(const eh_plugin_api& api, eh_model* m, eh_status st, const char* what) {
    if (st != EH_OK) throw std::runtime_error(std::string(what) + ": " + api.model_last_error(m));
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 8 && argc != 10) {
        std::fprintf(stderr, "usage: eh_vision_dump PLUGIN.so MODEL MMPROJ PIXELS TOKENS FIRST OUT [WIDTH HEIGHT]\n");
        return 1;
    }
    try {
        const eh_plugin_api& api = open_plugin(argv[1]);
        auto file = eh::model::ModelFile::open(argv[2]);
        auto mm = eh::model::ModelFile::open(argv[3]);
        eh_load_params lp{};
        lp.struct_size = sizeof(lp);
        lp.path = argv[2];
        lp.view = &file->view();
        eh_model* m = nullptr;
        if (api.model_load(&lp, &m) != EH_OK) throw std::runtime_error(std::string("load: ") + api.plugin_last_error());
        eh_image_encoder_info info{};
        info.struct_size = sizeof(info);
        check(api, m, api.image_encoder_load(m, &mm->view(), &info), "image_encoder_load");

        uint32_t width = info.image_width, height = info.image_height, n_img = info.n_tokens, grid = 0;
        if (info.tile) {
            if (argc != 10 || api.abi_minor < 8 || !api.image_encode_sized)
                throw std::runtime_error("the encoder takes each image at its own size: give WIDTH HEIGHT (ABI 1.8)");
            width = uint32_t(std::stoul(argv[8]));
            height = uint32_t(std::stoul(argv[9]));
            if (width % info.tile || height % info.tile) throw std::runtime_error("WIDTH and HEIGHT must be multiples of the tile");
            n_img = (width / info.tile) * (height / info.tile);
            if (info.span_flags & EH_SPAN_GRID) grid = width / info.tile;
        }
        std::ifstream pf(argv[4], std::ios::binary);
        std::vector<float> px(3ull * width * height);
        if (!pf.read(reinterpret_cast<char*>(px.data()), std::streamsize(px.size() * sizeof(float))))
            throw std::runtime_error("PIXELS holds fewer than 3 x " + std::to_string(height) + " x " +
                                     std::to_string(width) + " floats");
        std::vector<float> rows(size_t(n_img) * info.n_embd);
        if (info.tile)
            check(api, m, api.image_encode_sized(m, px.data(), width, height, rows.data()), "image_encode_sized");
        else
            check(api, m, api.image_encode(m, px.data(), rows.data()), "image_encode");

        const std::vector<int32_t> tokens = dump_tool::parse_tokens(argv[5], 0);
        const uint32_t first = uint32_t(std::stoul(argv[6]));
        if (first + n_img > tokens.size()) throw std::runtime_error("the image's span runs past TOKENS");
        eh_kv_params kp{};
        kp.struct_size = sizeof(kp);
        kp.max_seqs = 2;
        kp.max_step_tokens = uint32_t(tokens.size());
        kp.max_step_entries = 1;
        kp.max_seq_tokens = uint32_t(tokens.size()) + 1;
        kp.budget_bytes = 256ull << 20;
        eh_kv_info ki{};
        ki.struct_size = sizeof(ki);
        check(api, m, api.kv_init(m, &kp, &ki), "kv_init");
        auto logits_with = [&](const float* image_rows, uint32_t flags, uint32_t grid_width) {
            eh_seq* s = nullptr;
            check(api, m, api.seq_create(m, &s), "seq_create");
            const eh_embd_span span{first, n_img, flags, grid_width, image_rows};
            check(api, m, api.seq_embd_spans(s, &span, 1), "seq_embd_spans");
            eh_step_entry e{};
            e.struct_size = sizeof(e);
            e.flags = EH_STEP_LOGITS;
            e.seq = s;
            e.tokens = tokens.data();
            e.n_tokens = uint32_t(tokens.size());
            check(api, m, api.step(m, &e, 1), "step");
            const float* l = nullptr;
            uint32_t n = 0;
            check(api, m, api.seq_logits(s, &l, &n), "seq_logits");
            std::vector<float> out(l, l + n);
            api.seq_release(s);
            return out;
        };
        const std::vector<float> with = logits_with(rows.data(), info.span_flags, grid);
        const std::vector<float> zeros(rows.size(), 0.0f);
        const std::vector<float> without = logits_with(zeros.data(), info.span_flags, grid);
        const std::vector<float> one_axis =
            grid ? logits_with(rows.data(), info.span_flags & ~uint32_t(EH_SPAN_GRID), 0) : std::vector<float>();
        api.model_release(m);

        std::ofstream out(argv[7], std::ios::binary);
        auto u32 = [&](uint32_t v) { out.write(reinterpret_cast<const char*>(&v), 4); };
        auto floats = [&](const std::vector<float>& v) {
            out.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
        };
        u32(n_img), u32(info.n_embd), floats(rows);
        u32(uint32_t(with.size())), floats(with), floats(without), floats(one_axis);
        if (!out) throw std::runtime_error(std::string("cannot write ") + argv[7]);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
