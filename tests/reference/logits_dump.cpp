// eh_logits_dump: the logits a plugin gives for a token sequence, for
// tests/reference/conformance.py (teacher-forced log-probabilities against
// transformers and against ggml's own dequantization).
//
//   eh_logits_dump PLUGIN.so MODEL TOKENS OUT
//
// MODEL is a GGUF file or an HF directory (opened by the host's
// eh::model::ModelFile); TOKENS a comma-separated id list (at least 2). OUT
// gets little-endian: u32 rows, u32 vocab, then rows x vocab float32 —
// row i the logits after tokens[0..i] through the serving path (prefill of
// the first token, then session_decode per token), and one more row: the
// last position again, from a second session that prefills all tokens at
// once (the batched prefill path).
// Exit status: 0 written; 2 the plugin refused the model (its message on
// stderr, first line "refused: ..."); 1 any other failure.

#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.h>

#include <eh/model/model_file.hpp>

#include "dump_tool.hpp"

namespace {

using dump_tool::Refused;

class Run {
public:
    Run(const eh_plugin_api& api, const eh_model_view* view) : api_(api) {
        eh_load_params lp{};
        lp.struct_size = sizeof(lp);
        lp.path = "";
        lp.view = view;
        if (api_.model_load(&lp, &model_) != EH_OK) throw Refused(api_.plugin_last_error());
    }
    ~Run() {
        if (model_) api_.model_release(model_);
    }
    eh_session* session(uint32_t n_ctx) {
        eh_session_params sp{};
        sp.struct_size = sizeof(sp);
        sp.n_ctx = n_ctx;
        eh_session* s = nullptr;
        if (api_.session_create(model_, &sp, &s) != EH_OK)
            throw std::runtime_error(std::string("session: ") + api_.model_last_error(model_));
        eh_sampling_params g{};
        g.struct_size = sizeof(g);
        g.top_p = 1.0f;
        g.repetition_penalty = 1.0f;
        g.repetition_window = -1;
        api_.session_set_sampling(s, &g);
        return s;
    }
    void check(eh_session* s, eh_status st, const char* what) {
        if (st != EH_OK) throw std::runtime_error(std::string(what) + ": " + api_.session_last_error(s));
    }
    void append_logits(eh_session* s, std::vector<float>& out, uint32_t& vocab) {
        const float* l = nullptr;
        uint32_t n = 0;
        check(s, api_.session_logits(s, &l, &n), "logits");
        if (vocab && n != vocab) throw std::runtime_error("vocabulary size changed between calls");
        vocab = n;
        out.insert(out.end(), l, l + n);
    }
    const eh_plugin_api& api_;
    eh_model* model_ = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
    if (argc != 5) {
        std::fprintf(stderr, "usage: %s PLUGIN.so MODEL TOKENS OUT\n", argv[0]);
        return 1;
    }
    try {
        const eh_plugin_api& api = dump_tool::open_plugin(argv[1]);
        auto file = eh::model::ModelFile::open(argv[2]);
        const std::vector<int32_t> tokens = dump_tool::parse_tokens(argv[3], 2);
        const uint32_t n = static_cast<uint32_t>(tokens.size());
        Run run(api, &file->view());
        std::vector<float> logits;
        uint32_t vocab = 0;

        eh_session* s = run.session(n + 1);
        run.check(s, api.session_prefill(s, tokens.data(), 1), "prefill");
        run.append_logits(s, logits, vocab);
        for (uint32_t i = 1; i < n; ++i) {
            int32_t next = 0;
            run.check(s, api.session_decode(s, tokens[i], &next), "decode");
            run.append_logits(s, logits, vocab);
        }
        api.session_release(s);

        s = run.session(n + 1);
        run.check(s, api.session_prefill(s, tokens.data(), n), "prefill");
        run.append_logits(s, logits, vocab);
        api.session_release(s);

        std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(argv[4], "wb"), &std::fclose);
        if (!f) throw std::runtime_error(std::string("cannot write ") + argv[4]);
        const uint32_t header[2] = {n + 1, vocab};
        if (std::fwrite(header, sizeof(header), 1, f.get()) != 1 ||
            std::fwrite(logits.data(), sizeof(float), logits.size(), f.get()) != logits.size())
            throw std::runtime_error(std::string("short write to ") + argv[4]);
        return 0;
    } catch (const Refused& e) {
        std::fprintf(stderr, "refused: %s\n", e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
