// A small deterministic engine used by host tests (loader, service, HTTP).
// It runs no model: the next token is a pure function of the previous token,
// the position and the sampler seed, so tests can predict every id.
//
// Behaviour knobs (environment, read at model load):
//   EH_TEST_ENGINE_DELAY_MS   sleep this long in every decode step (cancel tests)
//   EH_TEST_ENGINE_EOS_AFTER  emit the model's EOS id after N decode steps
//   EH_TEST_ENGINE_SCRIPT     comma-separated ids: the output of every
//                             generation, then EOS (tests that need a model
//                             to write given text, e.g. a tool call)
//   EH_TEST_ENGINE_LOAD_DELAY_MS  take this long to load (startup tests)
//   EH_TEST_ENGINE_CRASH_AFTER  SIGSEGV at that decode step (a corrupt plugin)
//   EH_TEST_ENGINE_CRASH_AT_LOAD  SIGILL half-way through the model load
//   EH_TEST_ENGINE_HANG_AFTER  never return from that decode step (a plugin
//                             stuck in a kernel or a lock)
//   EH_TEST_ENGINE_FORK_SENSITIVE behave like CUDA across fork(): probe
//                             initialises per-process state, and fails in a
//                             forked child of a process that already did
//   EH_TEST_ENGINE_NO_GPU     the fake-gpu fixture's probe finds no driver
//   EH_TEST_ENGINE_KV_INFO_1_3  kv_init ignores eh_kv_params.kv_type and
//                             writes a 40-byte eh_kv_info, as a plugin built
//                             before ABI 1.4's KV cache types; without it
//                             the engine keeps F16 (by its word) and refuses
//                             any other type with EH_UNSUPPORTED
//   EH_TEST_ENGINE_KV_ANY_TYPE  kv_init takes any kv_type and still keeps
//                             F16 (a plugin breaking the rule that it must
//                             refuse a type it cannot store)
//   EH_TEST_ENGINE_DEVICE_BYTES  model_get_info's device_bytes_used: this
//                             many, plus 4 KiB a KV block once kv_init ran
//   EH_TEST_ENGINE_GPUS       (fake-gpu) the GPUs its probe sees, as their
//                             free memory in MiB, e.g. "10,70,40", or
//                             "busy" for one its probe refuses (unset:
//                             GPU 0 alone, no memory stated); fake-gpu
//                             spans up to 8 devices (ABI 1.6 max_devices)
//                             and names a load's device set in its model
//                             info's device_name
//   EH_TEST_ENGINE_BATCH_DEPENDENT  (step-only) a pick that depends on the
//                             step's entry count: batch invariance broken
//   Plugins breaking an ABI rule, for eh-plugin-check (step-only):
//   EH_TEST_ENGINE_LAX_TOKENS  step accepts token ids outside the vocabulary
//   EH_TEST_ENGINE_KEEP_BLOCKS  seq_truncate keeps the blocks past the new end
//   EH_TEST_ENGINE_NO_COPY    a step writes into a shared, partly filled
//                             block instead of copying it
//   EH_TEST_ENGINE_BIASED_LOGITS  seq_logits gives the logits after the
//                             step's logit biases, not the raw ones
//   EH_TEST_ENGINE_PROGRESS_BACK  load progress goes back once
//   EH_TEST_ENGINE_VERIFY_KEEPS_REJECTED  a verify entry (EH_STEP_VERIFY)
//                             leaves its rejected drafts in the sequence
//   EH_TEST_ENGINE_PARK_DRIFT  (step-only) a sequence seq_unpark restores picks
//                             differently from the one parked (1.7)
//   EH_TEST_ENGINE_NO_VERIFY  (step-only) kv_init grants no draft tokens: a
//                             1.6 plugin that does not verify
//
// Built several times with FIXTURE_MODE set to make the broken plugins the
// loader must reject; FIXTURE_MODE 0 is the well-behaved engine (session
// calls only), FIXTURE_MODE 15 the same engine through the batched step
// alone (ABI 1.4, no session calls): the same ids for the same input.
#include <engine_host/kv_blocks.hpp>
#include <engine_host/plugin_abi.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include <unistd.h>
#include <vector>

// The fixtures leave parts of the table out; their unused members stay compiled.
#pragma GCC diagnostic ignored "-Wunused-function"

#ifndef FIXTURE_MODE
#define FIXTURE_MODE 0
#endif
#define MODE_GOOD 0
#define MODE_WRONG_MAJOR 1
#define MODE_NULL_ENTRY 2
#define MODE_THROWS 3
#define MODE_PROBE_UNSUPPORTED 4
#define MODE_CRASH 5
#define MODE_HANG 6
#define MODE_DISAGREE 7
#define MODE_MISSING_ENTRY 8
#define MODE_SMALL_TABLE 9
#define MODE_ABI_1_1 10      // a table as a 1.1 build has it: 1.2's members absent
#define MODE_PARTIAL_BATCH 11  // 1.2 with only some of the batched members
#define MODE_FAKE_GPU 12       // says it is a CUDA engine; its probe accepts GPU 0 only
#define MODE_ABI_1_2 13        // a table as a 1.2 build has it: 1.3's step halves absent
#define MODE_HALF_STEPS 14     // 1.3's step_begin without step_end
#define MODE_STEP_ONLY 15      // 1.4: the batched group and no session calls
#define MODE_MIXED_SESSIONS 16 // 1.4: some session calls NULL, others set
#define MODE_NO_FORWARD 17     // 1.4: neither the session calls nor the batched group

#ifndef FIXTURE_NAME
#define FIXTURE_NAME "test-engine"
#endif

namespace {

struct Kv;  // the batched group's KV blocks (MODE_STEP_ONLY)

struct Model {
    std::string last_error;
    uint32_t vocab = 256;
    int32_t eos = -1;
    uint32_t ctx = 4096;
    int delay_ms = 0;
    int eos_after = -1;
    int crash_after = -1;  // EH_TEST_ENGINE_CRASH_AFTER: SIGSEGV at that decode step (a corrupt plugin)
    int hang_after = -1;   // EH_TEST_ENGINE_HANG_AFTER: that decode step never returns
    std::vector<int32_t> script;  // EH_TEST_ENGINE_SCRIPT
    std::shared_ptr<Kv> kv;       // set by kv_init
    std::string devices;          // (1.6) the load's device set, "0,2"; "" for one device
    uint64_t kv_bytes = 0;        // 4 KiB a KV block, once kv_init ran (EH_TEST_ENGINE_DEVICE_BYTES)
};

struct Session {
    Model* model;
    std::string last_error;
    uint32_t n_ctx;
    std::vector<int32_t> tokens;
    eh_sampling_params sp{};
    std::mt19937_64 rng;
    int steps = 0;
    std::vector<float> logits;
    eh_cancel_fn cancel = nullptr;
    void* cancel_user = nullptr;
    bool have_logits = false;
    int32_t next_token = 0;
    size_t script_pos = 0;  // output tokens since the last prefill's sample
    uint32_t drift = 0;     // added to every pick (EH_TEST_ENGINE_PARK_DRIFT after seq_unpark)
};

const char* const kFormats[] = {"gguf", "safetensors", nullptr};
#if FIXTURE_MODE == MODE_DISAGREE
const char* const kArchs[] = {"llama", "not-in-manifest", nullptr};
#else
const char* const kArchs[] = {"llama", "test-arch", nullptr};
#endif
const char* const kQuants[] = {"F32", "F16", nullptr};

const eh_plugin_info* info() {
#if FIXTURE_MODE == MODE_THROWS
    throw std::runtime_error("fixture: info() always throws");
#endif
    static const eh_plugin_info i = {sizeof(eh_plugin_info),
#if FIXTURE_MODE == MODE_DISAGREE
                                     "another-name",
#else
                                     FIXTURE_NAME,
#endif
                                     "1.0.0", "test", kFormats, kArchs, kQuants,
#if FIXTURE_MODE == MODE_FAKE_GPU
                                     EH_DEVICE_CUDA, 0, 8, 0};
#else
                                     EH_DEVICE_CPU, 0, 0, 0};
#endif
    return &i;
}

const char* plugin_last_error() { return ehp::thread_last_error().c_str(); }

// Mimics the CUDA runtime, whose state does not survive fork(): the first
// probe marks the process (in its environment, which children inherit), and
// a probe in a child of a marked process fails.
bool fork_sensitive_ok(eh_probe_result* out) {
    if (!std::getenv("EH_TEST_ENGINE_FORK_SENSITIVE")) return true;
    std::string me = std::to_string(getpid());
    const char* owner = std::getenv("EH_TEST_ENGINE_INITIALISED_IN");
    if (owner && me != owner) {
        ehp::copy_fixed(out->reason, "initialisation error: state inherited across fork()");
        return false;
    }
    setenv("EH_TEST_ENGINE_INITIALISED_IN", me.c_str(), 1);
    return true;
}

eh_status probe([[maybe_unused]] int32_t device, eh_probe_result* out) {
#if FIXTURE_MODE == MODE_CRASH
    std::raise(SIGSEGV);
#endif
#if FIXTURE_MODE == MODE_HANG
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
#endif
    out->supported = fork_sensitive_ok(out) ? 1 : 0;
#if FIXTURE_MODE == MODE_PROBE_UNSUPPORTED
    out->supported = 0;
    ehp::copy_fixed(out->reason, "fixture: needs hardware this machine lacks");
#endif
    ehp::copy_fixed(out->device_name, "test device");
#if FIXTURE_MODE == MODE_FAKE_GPU
    // As a CUDA plugin's probe answers on a machine without a driver
    // (EH_TEST_ENGINE_NO_GPU) or for a GPU ordinal that does not exist.
    if (std::getenv("EH_TEST_ENGINE_NO_GPU")) {
        out->supported = 0;
        ehp::copy_fixed(out->reason, "fixture: no usable CUDA device (no driver)");
    } else if (const char* g = std::getenv("EH_TEST_ENGINE_GPUS")) {
        std::vector<uint64_t> free_mib;
        for (const char* q = g; *q;) {
            char* end = nullptr;
            if (std::strncmp(q, "busy", 4) == 0) {  // a GPU the probe refuses
                free_mib.push_back(UINT64_MAX);
                end = const_cast<char*>(q) + 4;
            } else {
                free_mib.push_back(std::strtoull(q, &end, 10));
                if (end == q) break;
            }
            q = *end == ',' ? end + 1 : end;
        }
        if (device < 0 || size_t(device) >= free_mib.size()) {
            out->supported = 0;
            ehp::copy_fixed(out->reason, "fixture: CUDA device " + std::to_string(device) + " does not exist (" +
                                             std::to_string(free_mib.size()) + " present)");
        } else if (free_mib[size_t(device)] == UINT64_MAX) {
            out->supported = 0;
            ehp::copy_fixed(out->reason, "fixture: GPU " + std::to_string(device) + " is busy");
        } else {
            ehp::copy_fixed(out->device_name, "test GPU " + std::to_string(device));
            out->total_memory_bytes = uint64_t(141) << 30;
            out->free_memory_bytes = free_mib[size_t(device)] << 20;
        }
    } else if (device != 0) {
        out->supported = 0;
        ehp::copy_fixed(out->reason, "fixture: CUDA device " + std::to_string(device) + " does not exist (1 present)");
    }
#endif
    return EH_OK;
}

// Next id: greedy is a fixed walk; sampling mixes in the seeded generator.
int32_t pick(Session& s, int32_t prev) {
    Model& m = *s.model;
    if (!m.script.empty()) {
        const size_t i = s.script_pos++;
        if (i < m.script.size()) return m.script[i];
        if (m.eos >= 0) return m.eos;
    }
    if (m.eos_after >= 0 && s.steps >= m.eos_after && m.eos >= 0) return m.eos;
    uint64_t base = (uint64_t(prev) * 31u + s.tokens.size() * 7u + 3u + s.drift);
    if (s.sp.temperature > 0) base += s.rng() % 1000u;
    int32_t t = int32_t(base % m.vocab);
    if (t == m.eos) t = (t + 1) % int32_t(m.vocab);
    return t;
}

void fill_logits(Session& s, int32_t chosen) {
    s.logits.assign(s.model->vocab, -10.0f);
    s.logits[chosen] = 10.0f;
    s.have_logits = true;
}

eh_status model_load(const eh_load_params* p, eh_model** out) {
    return ehp::guard(ehp::thread_last_error(), [&]() -> eh_status {
        *out = nullptr;
        ehp::ModelView view(p->view);
        auto m = std::make_unique<Model>();
        if (auto n = view.get_uint(view.arch_key("vocab_size"))) m->vocab = uint32_t(*n);
        if (const eh_value* tok = view.find("tokenizer.ggml.tokens"); tok && tok->type == EH_VALUE_ARRAY)
            m->vocab = uint32_t(tok->count);
        if (auto e = view.get_uint("tokenizer.ggml.eos_token_id")) m->eos = int32_t(*e);
        if (auto c = view.get_uint(view.arch_key("context_length"))) m->ctx = uint32_t(*c);
        if (const char* d = std::getenv("EH_TEST_ENGINE_DELAY_MS")) m->delay_ms = std::atoi(d);
        if (const char* e = std::getenv("EH_TEST_ENGINE_EOS_AFTER")) m->eos_after = std::atoi(e);
        if (const char* c = std::getenv("EH_TEST_ENGINE_CRASH_AFTER")) m->crash_after = std::atoi(c);
        if (const char* h = std::getenv("EH_TEST_ENGINE_HANG_AFTER")) m->hang_after = std::atoi(h);
        if (const char* sc = std::getenv("EH_TEST_ENGINE_SCRIPT"))
            for (const char* p = sc; *p;) {
                char* end = nullptr;
                const long v = std::strtol(p, &end, 10);
                if (end == p) break;
                if (v >= 0 && uint32_t(v) < m->vocab) m->script.push_back(int32_t(v));
                p = *end == ',' ? end + 1 : end;
            }
        if (m->vocab == 0) throw ehp::Error(EH_MODEL_LOAD_FAILED, "vocabulary is empty");
        // a load option the tests send to see the load options arrive
        if (p->options_json && std::strstr(p->options_json, "\"refuse_load\""))
            throw ehp::Error(EH_INVALID_ARGUMENT, "fixture: the load options ask for a refusal");
        if (p->struct_size >= offsetof(eh_load_params, devices) + sizeof(p->devices) && p->n_devices > 0) {
            if (p->n_devices > info()->max_devices)
                throw ehp::Error(EH_INVALID_ARGUMENT, "fixture: more devices than max_devices");
            for (uint32_t i = 0; i < p->n_devices; ++i)
                m->devices += (i ? "," : "") + std::to_string(p->devices[i]);
        }
        if (const char* d = std::getenv("EH_TEST_ENGINE_LOAD_DELAY_MS"))
            std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(d)));
        for (int i = 0; i <= 4 && p->progress; ++i) {
            if (i == 2 && std::getenv("EH_TEST_ENGINE_CRASH_AT_LOAD")) std::raise(SIGILL);
            p->progress(p->progress_user, i / 4.0f, "test");
            if (i == 2 && std::getenv("EH_TEST_ENGINE_PROGRESS_BACK")) p->progress(p->progress_user, 0.25f, "test");
        }
        *out = reinterpret_cast<eh_model*>(m.release());
        return EH_OK;
    });
}

Model* M(const eh_model* m) { return reinterpret_cast<Model*>(const_cast<eh_model*>(m)); }
Session* S(const eh_session* s) { return reinterpret_cast<Session*>(const_cast<eh_session*>(s)); }

eh_status model_get_info(const eh_model* model, eh_model_info* out) {
    Model* m = M(model);
    ehp::copy_fixed(out->architecture, "llama");
    ehp::copy_fixed(out->quant_kind, "F32");
    out->context_length = m->ctx;
    out->vocab_size = m->vocab;
    out->device_bytes_used = 0;
    if (const char* b = std::getenv("EH_TEST_ENGINE_DEVICE_BYTES"))  // + 4 KiB a KV block once kv_init ran
        out->device_bytes_used = std::strtoull(b, nullptr, 10) + m->kv_bytes;
    out->host_bytes_used = 1024;
    ehp::copy_fixed(out->device_name, m->devices.empty() ? std::string("test device") : "test devices " + m->devices);
    return EH_OK;
}

eh_status model_check_residency(eh_model*, int32_t* resident) {
    *resident = std::getenv("EH_TEST_ENGINE_NOT_RESIDENT") ? 0 : 1;
    return EH_OK;
}
const char* model_last_error(const eh_model* m) { return M(m)->last_error.c_str(); }
void model_release(eh_model* m) { delete M(m); }

eh_status session_create(eh_model* model, const eh_session_params* p, eh_session** out) {
    Model* m = M(model);
    return ehp::guard(m->last_error, [&]() -> eh_status {
        if (p->n_ctx == 0) throw ehp::Error(EH_INVALID_ARGUMENT, "n_ctx must be positive");
        auto s = std::make_unique<Session>();
        s->model = m;
        s->n_ctx = p->n_ctx;
        s->cancel = p->cancel;
        s->cancel_user = p->cancel_user;
        s->sp.temperature = 0;
        *out = reinterpret_cast<eh_session*>(s.release());
        return EH_OK;
    });
}

eh_status session_set_sampling(eh_session* sess, const eh_sampling_params* p) {
    Session* s = S(sess);
    s->sp = *p;
    s->rng.seed(p->seed);
    return EH_OK;
}

eh_status check_room(Session* s, uint32_t n) {
    if (s->tokens.size() + n > s->n_ctx) {
        s->last_error = "context full: " + std::to_string(s->tokens.size()) + " + " + std::to_string(n) +
                        " > " + std::to_string(s->n_ctx);
        return EH_CONTEXT_FULL;
    }
    return EH_OK;
}

eh_status session_prefill(eh_session* sess, const int32_t* tokens, uint32_t n) {
    Session* s = S(sess);
    if (eh_status st = check_room(s, n); st != EH_OK) return st;
    for (uint32_t i = 0; i < n; ++i) {
        if (tokens[i] < 0 || uint32_t(tokens[i]) >= s->model->vocab) {
            s->last_error = "token id " + std::to_string(tokens[i]) + " out of range";
            return EH_INVALID_ARGUMENT;
        }
    }
    s->tokens.insert(s->tokens.end(), tokens, tokens + n);
    s->have_logits = false;
    return EH_OK;
}

eh_status session_sample(eh_session* sess, int32_t* out) {
    Session* s = S(sess);
    if (s->tokens.empty()) {
        s->last_error = "nothing to sample from: prefill first";
        return EH_INVALID_ARGUMENT;
    }
    s->script_pos = 0;  // a fresh generation
    *out = pick(*s, s->tokens.back());
    fill_logits(*s, *out);
    return EH_OK;
}

eh_status session_decode(eh_session* sess, int32_t token, int32_t* out) {
    Session* s = S(sess);
    if (s->cancel && s->cancel(s->cancel_user)) {
        s->last_error = "cancelled";
        return EH_CANCELLED;
    }
    if (eh_status st = check_room(s, 1); st != EH_OK) return st;
    if (s->model->delay_ms) std::this_thread::sleep_for(std::chrono::milliseconds(s->model->delay_ms));
    s->tokens.push_back(token);
    ++s->steps;
    if (s->model->crash_after >= 0 && s->steps > s->model->crash_after) std::raise(SIGSEGV);
    if (s->model->hang_after >= 0 && s->steps > s->model->hang_after)
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    *out = pick(*s, token);
    fill_logits(*s, *out);
    return EH_OK;
}

eh_status session_reset(eh_session* sess) {
    Session* s = S(sess);
    s->tokens.clear();
    s->steps = 0;
    s->have_logits = false;
    return EH_OK;
}

uint32_t session_n_past(const eh_session* s) { return uint32_t(S(s)->tokens.size()); }

eh_status session_logits(eh_session* sess, const float** out, uint32_t* n) {
    Session* s = S(sess);
    if (!s->have_logits) {
        s->last_error = "no logits yet";
        return EH_INVALID_ARGUMENT;
    }
    *out = s->logits.data();
    *n = uint32_t(s->logits.size());
    return EH_OK;
}

const char* session_last_error(const eh_session* s) { return S(s)->last_error.c_str(); }
void session_release(eh_session* s) { delete S(s); }


#if FIXTURE_MODE == MODE_STEP_ONLY
// The batched group over the same Session state: a sequence is a Session
// plus the KV blocks it holds. Blocks are reference counted so that forks
// share their prefix as the ABI says (a shared, partly filled last block is
// copied by the first step that appends to it).
constexpr uint32_t kBlockTokens = 16;
// Drafts one EH_STEP_VERIFY entry may carry (ABI 1.6): a verify keeps each
// draft that is the engine's own pick there, as greedy verification does.
constexpr uint32_t kMaxDraft = 8;
uint32_t max_draft() { return std::getenv("EH_TEST_ENGINE_NO_VERIFY") ? 0 : kMaxDraft; }

struct Kv {
    uint32_t max_seqs = 0, max_step_tokens = 0, max_step_entries = 0, max_seq_tokens = 0;
    std::vector<uint32_t> refs;   // per block; 0 = free
    uint32_t live = 0;            // sequences alive
    uint32_t free_blocks() const {
        uint32_t n = 0;
        for (uint32_t r : refs) n += r == 0;
        return n;
    }
    uint32_t take() {
        for (uint32_t b = 0; b < refs.size(); ++b)
            if (refs[b] == 0) { refs[b] = 1; return b; }
        return UINT32_MAX;  // callers check free_blocks() first
    }
};

struct Seq {
    Session s;
    std::vector<uint32_t> blocks;
    bool has_sampler = false;
    bool sampled_last = false;  // the previous step sampled: one token now is a decode
};

Seq* Q(const eh_seq* q) { return reinterpret_cast<Seq*>(const_cast<eh_seq*>(q)); }

Kv* find_kv(Model* m) { return m->kv.get(); }

uint32_t blocks_for(size_t tokens) { return uint32_t((tokens + kBlockTokens - 1) / kBlockTokens); }

eh_status kv_get_info(const eh_model* model, eh_kv_info* out);

eh_status kv_init(eh_model* model, const eh_kv_params* p, eh_kv_info* out) {
    Model* m = M(model);
    return ehp::guard(m->last_error, [&]() -> eh_status {
        if (find_kv(m)) throw ehp::Error(EH_INVALID_ARGUMENT, "kv_init was already called");
        if (!p->max_seqs || !p->max_step_tokens || !p->max_step_entries || !p->max_seq_tokens)
            throw ehp::Error(EH_INVALID_ARGUMENT, "kv_init: every limit must be positive");
        const uint32_t kv_type = ehp::asked_kv_type(*p);
        if (!std::getenv("EH_TEST_ENGINE_KV_INFO_1_3") && !std::getenv("EH_TEST_ENGINE_KV_ANY_TYPE") && kv_type != 0 &&
            kv_type != EH_TYPE_F16)
            ehp::refuse_kv_type(kv_type, "the test engine keeps F16 only");
        auto kv = std::make_shared<Kv>();
        kv->max_seqs = p->max_seqs;
        kv->max_step_tokens = p->max_step_tokens;
        kv->max_step_entries = p->max_step_entries;
        kv->max_seq_tokens = std::min(p->max_seq_tokens, m->ctx);
        // A token costs 64 bytes here; a budget buys that many blocks.
        const uint64_t block_bytes = uint64_t(kBlockTokens) * 64;
        uint64_t blocks = uint64_t(kv->max_seqs) * blocks_for(kv->max_seq_tokens);
        if (p->budget_bytes) blocks = std::min<uint64_t>(blocks, p->budget_bytes / block_bytes);
        if (blocks == 0) throw ehp::Error(EH_INSUFFICIENT_VRAM, "kv_init: the budget holds no block");
        kv->refs.assign(size_t(std::min<uint64_t>(blocks, 1u << 20)), 0);
        m->kv_bytes = uint64_t(kv->refs.size()) * 4096;
        m->kv = std::move(kv);
        return kv_get_info(model, out);
    });
}

eh_status kv_get_info(const eh_model* model, eh_kv_info* out) {
    Model* m = M(model);
    Kv* kv = find_kv(m);
    if (!kv) {
        m->last_error = "kv_init first";
        return EH_INVALID_ARGUMENT;
    }
    ehp::fill_versioned(out, [&](eh_kv_info& i) {
        i.block_tokens = kBlockTokens;
        i.total_blocks = uint32_t(kv->refs.size());
        i.free_blocks = kv->free_blocks();
        i.block_bytes = uint64_t(kBlockTokens) * 64;
        i.max_seqs = kv->max_seqs;
        i.max_step_tokens = kv->max_step_tokens;
        i.max_step_entries = kv->max_step_entries;
        i.max_seq_tokens = kv->max_seq_tokens;
        i.kv_type = EH_TYPE_F16;
        i.max_draft_tokens = max_draft();
    });
    if (std::getenv("EH_TEST_ENGINE_KV_INFO_1_3") && out->struct_size > offsetof(eh_kv_info, kv_type))
        out->struct_size = offsetof(eh_kv_info, kv_type);  // what a 1.3 plugin writes
    return EH_OK;
}

eh_status new_seq(Model* m, eh_seq** out, Seq** made) {
    Kv* kv = find_kv(m);
    if (!kv) {
        m->last_error = "kv_init first";
        return EH_INVALID_ARGUMENT;
    }
    if (kv->live >= kv->max_seqs) {
        m->last_error = "no room for another sequence: " + std::to_string(kv->max_seqs) + " are alive";
        return EH_NO_CAPACITY;
    }
    auto q = std::make_unique<Seq>();
    q->s.model = m;
    q->s.n_ctx = kv->max_seq_tokens;
    ++kv->live;
    *made = q.get();
    *out = reinterpret_cast<eh_seq*>(q.release());
    return EH_OK;
}

eh_status seq_create(eh_model* model, eh_seq** out) {
    Seq* q = nullptr;
    return new_seq(M(model), out, &q);
}

eh_status seq_fork(eh_seq* src, uint32_t n, eh_seq** out) {
    Seq* from = Q(src);
    Model* m = from->s.model;
    if (n > from->s.tokens.size()) {
        m->last_error = "seq_fork: " + std::to_string(n) + " tokens asked, the sequence has " +
                        std::to_string(from->s.tokens.size());
        return EH_INVALID_ARGUMENT;
    }
    Seq* q = nullptr;
    if (eh_status st = new_seq(m, out, &q); st != EH_OK) return st;
    Kv& kv = *find_kv(m);
    q->s.tokens.assign(from->s.tokens.begin(), from->s.tokens.begin() + n);
    q->blocks.assign(from->blocks.begin(), from->blocks.begin() + blocks_for(n));
    for (uint32_t b : q->blocks) ++kv.refs[b];
    return EH_OK;
}

void drop_blocks(Kv& kv, Seq& q, uint32_t keep) {
    while (q.blocks.size() > keep) {
        --kv.refs[q.blocks.back()];
        q.blocks.pop_back();
    }
}

eh_status seq_truncate(eh_seq* seq, uint32_t n) {
    Seq* q = Q(seq);
    Model* m = q->s.model;
    if (n > q->s.tokens.size()) {
        m->last_error = "seq_truncate: " + std::to_string(n) + " is past the sequence's length";
        return EH_INVALID_ARGUMENT;
    }
    q->s.tokens.resize(n);
    if (!std::getenv("EH_TEST_ENGINE_KEEP_BLOCKS")) drop_blocks(*find_kv(m), *q, blocks_for(n));
    q->s.have_logits = false;
    q->sampled_last = false;
    return EH_OK;
}

eh_status seq_set_sampling(eh_seq* seq, const eh_sampling_params* p) {
    Seq* q = Q(seq);
    q->s.sp = *p;
    q->s.rng.seed(p->seed);
    q->has_sampler = true;
    return EH_OK;
}

uint32_t seq_length(const eh_seq* seq) { return uint32_t(Q(seq)->s.tokens.size()); }

eh_status seq_logits(eh_seq* seq, const float** out, uint32_t* n) {
    Seq* q = Q(seq);
    if (!q->s.have_logits) {
        q->s.model->last_error = "no logits: the last step did not ask for them";
        return EH_INVALID_ARGUMENT;
    }
    *out = q->s.logits.data();
    *n = uint32_t(q->s.logits.size());
    return EH_OK;
}

void seq_release(eh_seq* seq) {
    Seq* q = Q(seq);
    Kv* kv = find_kv(q->s.model);
    drop_blocks(*kv, *q, 0);
    --kv->live;
    delete q;
}

// ABI 1.7's host tier: a parked copy is the sequence's tokens (its "KV"),
// 64 bytes a token as kv_init counts them. EH_TEST_ENGINE_PARK_DRIFT makes a
// restored sequence pick differently from the one parked (a copy that lost
// something): eh-plugin-check's park_restore must fail it.
struct Parked {
    Model* model;
    std::vector<int32_t> tokens;
};

eh_status seq_park(eh_seq* seq, uint32_t n, uint64_t max_bytes, eh_parked** out, uint64_t* bytes) {
    Seq* q = Q(seq);
    Model* m = q->s.model;
    *out = nullptr;
    *bytes = uint64_t(n) * 64;
    if (n == 0 || n > q->s.tokens.size()) {
        m->last_error = "seq_park: n_tokens " + std::to_string(n) + " is outside 1.." + std::to_string(q->s.tokens.size());
        return EH_INVALID_ARGUMENT;
    }
    if (*bytes > max_bytes) {
        m->last_error = "seq_park: " + std::to_string(*bytes) + " bytes, more than max_bytes";
        return EH_NO_CAPACITY;
    }
    auto* p = new Parked{m, std::vector<int32_t>(q->s.tokens.begin(), q->s.tokens.begin() + n)};
    *out = reinterpret_cast<eh_parked*>(p);
    return EH_OK;
}

eh_status seq_unpark(eh_model* model, const eh_parked* parked, const int32_t* tokens, uint32_t n, eh_seq** out) {
    Model* m = M(model);
    const auto* p = reinterpret_cast<const Parked*>(parked);
    *out = nullptr;
    if (!p || p->model != m || n != p->tokens.size() || !std::equal(p->tokens.begin(), p->tokens.end(), tokens)) {
        m->last_error = "seq_unpark: the tokens are not the parked copy's";
        return EH_INVALID_ARGUMENT;
    }
    Kv& kv = *find_kv(m);
    if (blocks_for(n) > kv.free_blocks()) {
        m->last_error = "seq_unpark: not enough free KV blocks";
        return EH_KV_FULL;
    }
    Seq* q = nullptr;
    if (eh_status st = new_seq(m, out, &q); st != EH_OK) return st;
    q->s.tokens = p->tokens;
    for (uint32_t b = 0; b < blocks_for(n); ++b) q->blocks.push_back(kv.take());
    if (std::getenv("EH_TEST_ENGINE_PARK_DRIFT")) q->s.drift = 1;
    return EH_OK;
}

void parked_release(eh_parked* p) { delete reinterpret_cast<Parked*>(p); }

// New blocks the entry needs: past the ones it holds, plus a copy of a
// shared, partly filled last block it appends into.
uint32_t blocks_needed(const Kv& kv, const Seq& q, uint32_t n_tokens) {
    const size_t len = q.s.tokens.size();
    uint32_t need = blocks_for(len + n_tokens) - uint32_t(q.blocks.size());
    if (len % kBlockTokens != 0 && kv.refs[q.blocks.back()] > 1 && !std::getenv("EH_TEST_ENGINE_NO_COPY")) ++need;
    return need;
}

// The sampler stages the batched step promises (plugin_abi.h), over the
// engine's fake logits (+10 for its pick, -10 for every other id): top_k 1
// is greedy, logit biases add to those logits, and the allowed mask keeps
// the best allowed id. EH_TEST_ENGINE_BATCH_DEPENDENT makes the pick depend
// on how many entries share the step: a broken engine for eh-plugin-check.
// *raw is the pick before biases and mask, whose logits seq_logits gives.
int32_t obey(const eh_step_entry& e, Session& s, uint32_t n_entries, int32_t* raw) {
    const float saved = s.sp.temperature;
    if (s.sp.top_k == 1) s.sp.temperature = 0;
    int32_t t = pick(s, s.tokens.back());
    s.sp.temperature = saved;
    if (std::getenv("EH_TEST_ENGINE_BATCH_DEPENDENT")) t = int32_t((uint32_t(t) + n_entries - 1) % s.model->vocab);
    *raw = t;
    auto logit = [&](int32_t id) {
        float v = id == t ? 10.0f : -10.0f;
        for (uint32_t i = 0; i < e.n_bias; ++i)
            if (e.bias_tokens[i] == id) v += e.bias_values[i];
        return v;
    };
    auto allowed = [&](int32_t id) { return !e.allowed || (e.allowed[uint32_t(id) / 32] >> (uint32_t(id) % 32)) & 1u; };
    int32_t best = -1;
    auto consider = [&](int32_t id) {
        if (allowed(id) && (best < 0 || logit(id) > logit(best))) best = id;
    };
    consider(t);
    for (uint32_t i = 0; i < e.n_bias; ++i) consider(e.bias_tokens[i]);
    for (uint32_t id = 0; best < 0 && id < s.model->vocab; ++id) consider(int32_t(id));
    return best < 0 ? t : best;
}

eh_status step(eh_model* model, eh_step_entry* entries, uint32_t n) {
    Model* m = M(model);
    Kv* kv = find_kv(m);
    if (!kv) {
        m->last_error = "kv_init first";
        return EH_INVALID_ARGUMENT;
    }
    auto entry = [&](uint32_t i) -> eh_step_entry& {
        return *reinterpret_cast<eh_step_entry*>(reinterpret_cast<char*>(entries) + size_t(i) * entries[0].struct_size);
    };
    auto invalid = [&](uint32_t i, const std::string& what) {
        m->last_error = "step entry " + std::to_string(i) + ": " + what;
        return EH_INVALID_ARGUMENT;
    };
    if (n == 0 || n > kv->max_step_entries) return invalid(0, "entry count out of range");
    if (entries[0].struct_size < sizeof(eh_step_entry)) return invalid(0, "struct_size smaller than eh_step_entry");
    uint64_t total = 0, need = 0;
    for (uint32_t i = 0; i < n; ++i) {
        eh_step_entry& e = entry(i);
        if (!e.seq) return invalid(i, "no sequence");
        for (uint32_t j = 0; j < i; ++j)
            if (entry(j).seq == e.seq) return invalid(i, "the sequence is in the step twice");
        if (e.n_tokens == 0 || !e.tokens) return invalid(i, "no tokens");
        for (uint32_t t = 0; t < e.n_tokens; ++t)
            if ((e.tokens[t] < 0 || uint32_t(e.tokens[t]) >= m->vocab) && !std::getenv("EH_TEST_ENGINE_LAX_TOKENS"))
                return invalid(i, "token id " + std::to_string(e.tokens[t]) + " out of range");
        Seq* q = Q(e.seq);
        if (e.flags & ~uint32_t(EH_STEP_SAMPLE | EH_STEP_LOGITS | (max_draft() ? EH_STEP_VERIFY : 0u)))
            return invalid(i, "flags this engine does not offer");
        if ((e.flags & EH_STEP_VERIFY) &&
            (!(e.flags & EH_STEP_SAMPLE) || (e.flags & EH_STEP_LOGITS) || e.n_tokens < 2 || e.n_tokens - 1 > max_draft()))
            return invalid(i, "EH_STEP_VERIFY needs EH_STEP_SAMPLE, no EH_STEP_LOGITS and 1 to " +
                                  std::to_string(max_draft()) + " drafts");
        for (uint32_t b = 0; b < e.n_bias; ++b)
            if (!e.bias_tokens || !e.bias_values || e.bias_tokens[b] < 0 || uint32_t(e.bias_tokens[b]) >= m->vocab ||
                !std::isfinite(e.bias_values[b]))
                return invalid(i, "a logit bias outside the vocabulary or not finite");
        if (e.allowed) {
            bool any = false;
            for (uint32_t t = 0; t < m->vocab && !any; ++t) any = (e.allowed[t / 32] >> (t % 32)) & 1u;
            if (!any) return invalid(i, "the mask allows no token");
        }
        if ((e.flags & EH_STEP_SAMPLE) && !q->has_sampler) return invalid(i, "sampling without a sampler");
        if (q->s.tokens.size() + e.n_tokens > kv->max_seq_tokens) return invalid(i, "past max_seq_tokens");
        total += e.n_tokens;
        need += blocks_needed(*kv, *q, e.n_tokens);
    }
    if (total > kv->max_step_tokens) return invalid(0, "more tokens than max_step_tokens");
    if (need > kv->free_blocks()) {
        m->last_error = "KV full: the step needs " + std::to_string(need) + " free blocks, " +
                        std::to_string(kv->free_blocks()) + " are free";
        return EH_KV_FULL;
    }
    if (m->delay_ms) std::this_thread::sleep_for(std::chrono::milliseconds(m->delay_ms));
    for (uint32_t i = 0; i < n; ++i) {
        eh_step_entry& e = entry(i);
        Seq& q = *Q(e.seq);
        // Copy a shared, partly filled last block before writing into it.
        if (q.s.tokens.size() % kBlockTokens != 0 && kv->refs[q.blocks.back()] > 1 &&
            !std::getenv("EH_TEST_ENGINE_NO_COPY")) {
            --kv->refs[q.blocks.back()];
            q.blocks.back() = kv->take();
        }
        const bool decode = q.sampled_last && e.n_tokens == 1;
        if (e.flags & EH_STEP_VERIFY) {
            // Each position as a decode step would pick it: a draft equal to
            // that pick stays, the first other one ends the entry.
            q.s.tokens.push_back(e.tokens[0]);
            e.n_accepted = 0;
            for (;;) {
                ++q.s.steps;
                if (m->crash_after >= 0 && q.s.steps > m->crash_after) std::raise(SIGSEGV);
                int32_t raw = -1;
                e.token = obey(e, q.s, n, &raw);
                if (e.n_accepted + 1 >= e.n_tokens || e.tokens[e.n_accepted + 1] != e.token) break;
                q.s.tokens.push_back(e.tokens[++e.n_accepted]);
            }
            if (std::getenv("EH_TEST_ENGINE_VERIFY_KEEPS_REJECTED"))
                q.s.tokens.insert(q.s.tokens.end(), e.tokens + 1 + e.n_accepted, e.tokens + e.n_tokens);
            while (q.blocks.size() < blocks_for(q.s.tokens.size())) q.blocks.push_back(kv->take());
            q.s.have_logits = false;
            q.sampled_last = true;
            continue;
        }
        q.s.tokens.insert(q.s.tokens.end(), e.tokens, e.tokens + e.n_tokens);
        while (q.blocks.size() < blocks_for(q.s.tokens.size())) q.blocks.push_back(kv->take());
        q.s.have_logits = false;
        e.token = -1;
        q.sampled_last = (e.flags & EH_STEP_SAMPLE) != 0;
        if (!q.sampled_last) continue;
        if (decode) {
            ++q.s.steps;
            if (m->crash_after >= 0 && q.s.steps > m->crash_after) std::raise(SIGSEGV);
            if (m->hang_after >= 0 && q.s.steps > m->hang_after)
                for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
        } else {
            q.s.script_pos = 0;  // a fresh generation
        }
        int32_t raw = -1;
        e.token = obey(e, q.s, n, &raw);
        if (e.flags & EH_STEP_LOGITS) fill_logits(q.s, std::getenv("EH_TEST_ENGINE_BIASED_LOGITS") ? e.token : raw);
    }
    return EH_OK;
}
#endif

#if FIXTURE_MODE == MODE_PARTIAL_BATCH
eh_status partial_kv_init(eh_model*, const eh_kv_params*, eh_kv_info*) { return EH_UNSUPPORTED; }
#endif
#if FIXTURE_MODE == MODE_HALF_STEPS
eh_status half_step_begin(eh_model*, eh_step_entry*, uint32_t) { return EH_UNSUPPORTED; }
#endif

const eh_plugin_api kApi = {
#if FIXTURE_MODE == MODE_SMALL_TABLE
    16,
#elif FIXTURE_MODE == MODE_ABI_1_1
    offsetof(eh_plugin_api, kv_init),
#elif FIXTURE_MODE == MODE_ABI_1_2
    offsetof(eh_plugin_api, step_begin),
#else
    sizeof(eh_plugin_api),
#endif
#if FIXTURE_MODE == MODE_WRONG_MAJOR
    EH_ABI_MAJOR + 1,
#else
    EH_ABI_MAJOR,
#endif
#if FIXTURE_MODE == MODE_ABI_1_1
    1,  // built against ABI 1.1: the 1.2 host must still accept it
#elif FIXTURE_MODE == MODE_ABI_1_2
    2,  // built against ABI 1.2: the 1.3 host must still accept it
#else
    EH_ABI_MINOR,
#endif
    info, plugin_last_error, probe, model_load, model_get_info, model_check_residency,
    model_last_error, model_release,
#if FIXTURE_MODE == MODE_STEP_ONLY || FIXTURE_MODE == MODE_NO_FORWARD
    nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
#elif FIXTURE_MODE == MODE_MIXED_SESSIONS
    session_create, session_set_sampling, session_prefill, nullptr, nullptr, session_reset,
    session_n_past, session_logits, session_last_error, session_release,
#else
    session_create, session_set_sampling, session_prefill,
    session_sample, session_decode, session_reset, session_n_past, session_logits,
    session_last_error, session_release,
#endif
#if FIXTURE_MODE == MODE_STEP_ONLY
    kv_init, kv_get_info, seq_create, seq_fork, seq_truncate, seq_set_sampling, seq_length, seq_logits,
    seq_release, step, nullptr, nullptr,
    nullptr,                    // seq_hidden (1.5)
    nullptr, nullptr, nullptr,  // the adapter calls (1.6)
    nullptr, nullptr, nullptr,  // the image calls (1.6)
    seq_park, seq_unpark, parked_release,  // the host tier (1.7)
#endif
#if FIXTURE_MODE == MODE_PARTIAL_BATCH
    partial_kv_init,
#endif
#if FIXTURE_MODE == MODE_HALF_STEPS
    nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
    half_step_begin,
#endif
};

}  // namespace

#if FIXTURE_MODE != MODE_MISSING_ENTRY
extern "C" EH_PLUGIN_EXPORT const eh_plugin_api* eh_plugin_entry(uint16_t, uint16_t) {
#if FIXTURE_MODE == MODE_NULL_ENTRY
    return nullptr;
#else
    return &kApi;
#endif
}
#else
// Exports something, just not the entry point.
extern "C" EH_PLUGIN_EXPORT int eh_plugin_entry_typo(void) { return 0; }
#endif
