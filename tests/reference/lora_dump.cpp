// eh_lora_dump: the logits a plugin gives for a token sequence with a LoRA
// adapter (ABI 1.6), for tests/reference/lora_reference.py (against
// transformers + peft, or merged weights in torch).
//
//   eh_lora_dump PLUGIN.so MODEL ADAPTER SCALE TOKENS OUT
//
// MODEL is a GGUF file or an HF directory, ADAPTER a GGUF LoRA file (both
// opened by the host's eh::model::ModelFile; the adapter checked by
// ehp::read_lora_adapter as serve does); TOKENS a comma-separated id list.
// Two sequences run side by side in the same batched steps, one with the
// adapter and one without, one token a step. OUT gets little-endian: u32
// rows, u32 vocab, then rows x vocab float32 with the adapter (row i: the
// logits after tokens[0..i]), then rows x vocab without it.
// Exit status: 0 written; 2 the plugin refused the model or the adapter (its
// message on stderr, first line "refused: ..."); 1 any other failure.

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <engine_host/lora_adapter.hpp>
#include <engine_host/plugin_abi.h>

#include <eh/model/model_file.hpp>

#include "dump_tool.hpp"

namespace {

using dump_tool::Refused;

const eh_plugin_api& open_plugin(const char* path) {
    const eh_plugin_api& api = dump_tool::open_plugin(path);
    if (api.abi_minor < 6 || !api.adapter_load || !api.seq_set_adapter || !api.step)
        throw Refused("the plugin has no ABI 1.6 adapter calls");
    return api;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 7) {
        std::fprintf(stderr, "usage: %s PLUGIN.so MODEL ADAPTER SCALE TOKENS OUT\n", argv[0]);
        return 1;
    }
    eh_model* model = nullptr;
    eh_adapter* adapter = nullptr;
    eh_seq* seqs[2] = {nullptr, nullptr};
    const eh_plugin_api* api = nullptr;
    int rc = 0;
    try {
        api = &open_plugin(argv[1]);
        auto file = eh::model::ModelFile::open(argv[2]);
        auto afile = eh::model::ModelFile::open(argv[3]);
        const float scale = std::stof(argv[4]);
        const std::vector<int32_t> tokens = dump_tool::parse_tokens(argv[5], 1);
        const uint32_t n = static_cast<uint32_t>(tokens.size());
        auto fail = [&](const char* what) { return std::runtime_error(std::string(what) + ": " + api->model_last_error(model)); };

        eh_load_params lp{};
        lp.struct_size = sizeof(lp);
        lp.path = "";
        lp.view = &file->view();
        if (api->model_load(&lp, &model) != EH_OK) throw Refused(api->plugin_last_error());
        eh_kv_params kp{};
        kp.struct_size = sizeof(kp);
        kp.max_seqs = 2;
        kp.max_step_tokens = 64;
        kp.max_step_entries = 2;
        kp.max_seq_tokens = n + 16;
        eh_kv_info kv{};
        kv.struct_size = sizeof(kv);
        if (api->kv_init(model, &kp, &kv) != EH_OK) throw fail("kv_init");

        ehp::LoraAdapterInfo info;
        try {
            info = ehp::read_lora_adapter(afile->view(), file->view());
        } catch (const ehp::Error& e) {
            throw Refused(e.what());
        }
        eh_adapter_params ap{};
        ap.struct_size = sizeof(ap);
        ap.view = &afile->view();
        ap.scale = scale;
        ap.alpha = info.alpha;
        if (api->adapter_load(model, &ap, &adapter) != EH_OK) throw Refused(api->model_last_error(model));

        eh_sampling_params g{};
        g.struct_size = sizeof(g);
        g.top_p = 1.0f;
        g.repetition_penalty = 1.0f;
        g.repetition_window = -1;
        for (eh_seq*& s : seqs) {
            if (api->seq_create(model, &s) != EH_OK) throw fail("seq_create");
            if (api->seq_set_sampling(s, &g) != EH_OK) throw fail("seq_set_sampling");
        }
        if (api->seq_set_adapter(seqs[0], adapter) != EH_OK) throw fail("seq_set_adapter");

        std::vector<float> rows[2];
        uint32_t vocab = 0;
        for (uint32_t i = 0; i < n; ++i) {
            eh_step_entry e[2]{};
            for (int k = 0; k < 2; ++k) {
                e[k].struct_size = sizeof(eh_step_entry);
                e[k].flags = EH_STEP_SAMPLE | EH_STEP_LOGITS;
                e[k].seq = seqs[k];
                e[k].tokens = &tokens[i];
                e[k].n_tokens = 1;
            }
            if (api->step(model, e, 2) != EH_OK) throw fail("step");
            for (int k = 0; k < 2; ++k) {
                const float* l = nullptr;
                uint32_t nv = 0;
                if (api->seq_logits(seqs[k], &l, &nv) != EH_OK) throw fail("seq_logits");
                vocab = nv;
                rows[k].insert(rows[k].end(), l, l + nv);
            }
        }

        std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(argv[6], "wb"), &std::fclose);
        if (!f) throw std::runtime_error(std::string("cannot write ") + argv[6]);
        const uint32_t header[2] = {n, vocab};
        if (std::fwrite(header, sizeof(header), 1, f.get()) != 1) throw std::runtime_error("short write");
        for (const auto& r : rows)
            if (std::fwrite(r.data(), sizeof(float), r.size(), f.get()) != r.size()) throw std::runtime_error("short write");
    } catch (const Refused& e) {
        std::fprintf(stderr, "refused: %s\n", e.what());
        rc = 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        rc = 1;
    }
    if (api) {
        for (eh_seq* s : seqs)
            if (s) api->seq_release(s);
        if (adapter) api->adapter_release(adapter);
        if (model) api->model_release(model);
    }
    return rc;
}
