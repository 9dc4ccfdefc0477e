// What LoRA adapters cost a batched step (issue 50's 0.8x target): llama-cuda
// on a real-shape file, 64 sequences decoding together, with no adapter and
// with rank-16 adapters on q/k/v/o/gate/up/down of every layer in several
// spreads over the rows; ms per step (wall time around step(), after the
// graphs are captured), not an assertion. Disabled by default (a model of
// gigabytes); run with
//   EH_LORA_BENCH_MODEL=llama-3.1-8b-instruct-q4_k_m.gguf eh_cuda_lora_tests
//     --gtest_also_run_disabled_tests --gtest_filter='LoraStepBench.*'
// (a missing file is forged there first: EH_LORA_BENCH_LIKE, default
// llama-3.1-8b-instruct-q4_k_m, synthetic vocabulary).
// EH_LORA_BENCH_PHASES: the phases to run (comma-separated names below;
// default all); EH_LORA_BENCH_STEPS: timed decode steps per phase (64);
// EH_BENCH_PROFILE_STEP=K (with EH_LORA_BENCH_PROFILE=PHASE): decode step K
// of that phase inside cudaProfilerStart/Stop, for `ncu --profile-from-start
// off`. The adapters are forged here (lora_forge.hpp), one file loaded 8
// times: each load is a copy of its own in device memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <eh/model/model_file.hpp>
#include <eh/tools/forge.hpp>

#include "lora_forge.hpp"
#include "plugin_pair.hpp"
#include "profiled_step.hpp"
#include "step_seq.hpp"

namespace {

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int env_int(const char* name, int fallback) {
    const char* v = std::getenv(name);
    return v && *v ? std::atoi(v) : fallback;
}

bool phase_on(const std::string& name) {
    const char* v = std::getenv("EH_LORA_BENCH_PHASES");
    if (!v || !*v) return true;
    std::string list(v);
    for (size_t at = 0; at <= list.size();) {
        const size_t end = std::min(list.find(',', at), list.size());
        if (list.compare(at, end - at, name) == 0) return true;
        at = end + 1;
    }
    return false;
}

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

constexpr uint32_t kSeqs = 64, kAdapters = 8, kPrompt = 24, kWarm = 4;

TEST(LoraStepBench, DISABLED_Decode64RowsOver8Adapters) {
    const char* path = std::getenv("EH_LORA_BENCH_MODEL");
    ASSERT_TRUE(path && *path) << "EH_LORA_BENCH_MODEL names the model file (a forged llama-3.1-8b-instruct-q4_k_m)";
    const int steps = std::max(1, env_int("EH_LORA_BENCH_STEPS", 64));
    const uint32_t rank = uint32_t(std::max(1, env_int("EH_LORA_BENCH_RANK", 16)));
    double t0 = now_s();
    if (!std::filesystem::exists(path)) {
        eh::tools::ForgeOptions o;
        o.profile = std::getenv("EH_LORA_BENCH_LIKE") ? std::getenv("EH_LORA_BENCH_LIKE")
                                                           : "llama-3.1-8b-instruct-q4_k_m";
        o.out = path;
        o.seed = 1;
        o.vocab = "none";
        eh::tools::forge(o);
        std::printf("[lora-bench] forged %s (%s) in %.1f s\n", path, o.profile.c_str(), now_s() - t0);
        t0 = now_s();
    }
    const std::unique_ptr<eh::model::ModelFile> file = eh::model::ModelFile::open(path);
    // One rank-`rank` F16 adapter on every q/k/v/o/gate/up/down (as
    // scripts/device-lora.sh forges them), loaded kAdapters times.
    t0 = now_s();
    std::vector<lora_forge::Target> targets;
    const eh_model_view& v = file->view();
    for (uint64_t i = 0; i < v.n_tensors; ++i) {
        const std::string name(v.tensors[i].name.data, v.tensors[i].name.size);
        for (const char* k : {".attn_q.weight", ".attn_k.weight", ".attn_v.weight", ".attn_output.weight",
                              ".ffn_gate.weight", ".ffn_up.weight", ".ffn_down.weight"})
            if (name.rfind("blk.", 0) == 0 && ends_with(name, k)) targets.push_back({name, rank, EH_TYPE_F16});
    }
    ASSERT_FALSE(targets.empty());
    const std::vector<uint8_t> gguf = lora_forge::forge(*file, targets, 32.0f, 7, 0.01f).gguf();
    const std::unique_ptr<eh::model::ModelFile> afile =
        eh::model::ModelFile::open_gguf_buffer(gguf.data(), gguf.size(), "forged-adapter.gguf");
    std::printf("[lora-bench] %zu pairs of rank %u forged in %.1f s\n", targets.size(), rank, now_s() - t0);
    const eh_plugin_api* api = ehtest::llama_cuda_api();
    ASSERT_TRUE(ehtest::gpu_usable(api)) << "llama-cuda does not load or finds no device";
    t0 = now_s();
    ehtest::KvShape kv;
    kv.max_seqs = kSeqs;
    kv.max_step_entries = kSeqs;
    kv.max_step_tokens = 512;
    kv.max_seq_tokens = 256;
    ehtest::StepModel m(api, &file->view(), kv, std::getenv("EH_LORA_BENCH_OPTIONS"), path);
    ASSERT_TRUE(m.ok()) << m.failure;
    std::printf("[lora-bench] model %s loaded with kv_init in %.1f s\n", path, now_s() - t0);

    t0 = now_s();
    std::vector<eh_adapter*> ads(kAdapters, nullptr);
    for (eh_adapter*& a : ads) {
        eh_adapter_params p{};
        p.struct_size = sizeof p;
        p.view = &afile->view();
        p.scale = 1.0f;
        p.alpha = 32.0f;
        ASSERT_EQ(api->adapter_load(m.model, &p, &a), EH_OK) << m.error();
    }
    std::printf("[lora-bench] the adapter loaded %u times in %.1f s\n", kAdapters, now_s() - t0);

    std::vector<eh_seq*> seqs;
    for (uint32_t i = 0; i < kSeqs; ++i) seqs.push_back(m.create());
    eh_model_info info{};
    info.struct_size = sizeof info;
    ASSERT_EQ(api->model_get_info(m.model, &info), EH_OK) << m.error();
    const uint32_t vocab = info.vocab_size;
    std::vector<int32_t> prompt(size_t(kSeqs) * kPrompt);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 7919 + 17) % vocab);
    std::vector<int32_t> next(kSeqs, 0);
    const char* profile_phase = std::getenv("EH_LORA_BENCH_PROFILE");

    // Every sequence emptied and given its adapter (null: none), the
    // prompts in steps of up to 512 tokens, kWarm decode steps (the eager
    // first run and the captures), `steps` timed decode steps of all kSeqs
    // rows, then steps mixing 8 new prompts with 56 decodes (eager).
    auto phase = [&](const std::string& name, const std::function<eh_adapter*(uint32_t)>& adapter_of) {
        if (!phase_on(name)) return;
        for (uint32_t i = 0; i < kSeqs; ++i) {
            ASSERT_EQ(api->seq_truncate(seqs[i], 0), EH_OK) << m.error();
            ASSERT_EQ(api->seq_set_adapter(seqs[i], adapter_of(i)), EH_OK) << m.error();
        }
        const uint32_t per_step = 512 / kPrompt;
        double t = now_s();
        int prefill_steps = 0;
        for (uint32_t i0 = 0; i0 < kSeqs; i0 += per_step, ++prefill_steps) {
            std::vector<eh_step_entry> es;
            for (uint32_t i = i0; i < std::min(kSeqs, i0 + per_step); ++i)
                es.push_back(ehtest::step_entry(seqs[i], &prompt[size_t(i) * kPrompt], kPrompt, EH_STEP_SAMPLE));
            ASSERT_EQ(api->step(m.model, es.data(), uint32_t(es.size())), EH_OK) << m.error();
            for (size_t j = 0; j < es.size(); ++j) next[i0 + j] = es[j].token;
        }
        const double prefill = now_s() - t;
        std::vector<eh_step_entry> es(kSeqs);
        auto decode = [&]() {
            for (uint32_t i = 0; i < kSeqs; ++i) es[i] = ehtest::step_entry(seqs[i], &next[i], 1, EH_STEP_SAMPLE);
            const eh_status st = api->step(m.model, es.data(), kSeqs);
            for (uint32_t i = 0; i < kSeqs; ++i) next[i] = es[i].token;
            return st;
        };
        for (uint32_t w = 0; w < kWarm; ++w) ASSERT_EQ(decode(), EH_OK) << m.error();
        const ehtest::ProfiledStep prof;
        const bool profiled = profile_phase && name == profile_phase;
        std::vector<double> each;
        t = now_s();
        for (int k = 0; k < steps; ++k) {
            const double s0 = now_s();
            if (profiled) prof.begin(k);
            ASSERT_EQ(decode(), EH_OK) << m.error();
            if (profiled) prof.end(k);
            each.push_back(now_s() - s0);
        }
        const double total = now_s() - t;
        std::sort(each.begin(), each.end());
        // 8 sequences start over beside the other 56's decodes (the server's
        // steps when new requests arrive): eager, one step each.
        t = now_s();
        const uint32_t mixed = 4;
        for (uint32_t k = 0; k < mixed; ++k) {
            std::vector<eh_step_entry> mix;
            for (uint32_t i = 0; i < kSeqs; ++i) {
                if (i / 8 == k) {
                    ASSERT_EQ(api->seq_truncate(seqs[i], 0), EH_OK) << m.error();
                    mix.push_back(ehtest::step_entry(seqs[i], &prompt[size_t(i) * kPrompt], kPrompt, EH_STEP_SAMPLE));
                } else {
                    mix.push_back(ehtest::step_entry(seqs[i], &next[i], 1, EH_STEP_SAMPLE));
                }
            }
            ASSERT_EQ(api->step(m.model, mix.data(), uint32_t(mix.size())), EH_OK) << m.error();
            for (uint32_t i = 0; i < kSeqs; ++i) next[i] = mix[i].token;
        }
        const double mix_s = now_s() - t;
        std::printf("[lora-bench] %-10s decode %u rows: %.3f ms/step (median %.3f, min %.3f, max %.3f; %d steps), "
                    "%.0f tok/s; prefill %u x %u tokens: %.1f ms in %d steps; prompts+decodes (8 x %u + 56): %.2f "
                    "ms/step\n",
                    name.c_str(), kSeqs, total / steps * 1e3, each[each.size() / 2] * 1e3, each.front() * 1e3,
                    each.back() * 1e3, steps, kSeqs * steps / total, kSeqs, kPrompt, prefill * 1e3, prefill_steps,
                    kPrompt, mix_s / mixed * 1e3);
    };
    // "base": adapters loaded, no sequence uses one (the server's base
    // requests beside adapted ones); "mixed8": row i has adapter i % 8 (8
    // rows each, interleaved, as a server's arrivals mix them);
    // "grouped8": row i has adapter i / 8; "one": every row the same one.
    phase("base", [](uint32_t) -> eh_adapter* { return nullptr; });
    phase("mixed8", [&](uint32_t i) { return ads[i % kAdapters]; });
    phase("grouped8", [&](uint32_t i) { return ads[i / (kSeqs / kAdapters)]; });
    phase("one", [&](uint32_t) { return ads[0]; });
    phase("base2", [](uint32_t) -> eh_adapter* { return nullptr; });
    for (eh_seq* s : seqs) m.release(s);
    for (eh_adapter* a : ads) api->adapter_release(a);
}

}  // namespace
