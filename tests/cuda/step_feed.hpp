// Several sequences fed teacher-forced through one model's batched step
// (step_seq.hpp's StepModel), so that prefill chunks of some share steps
// with the decodes of others: the mixes the batched tests compare against
// each sequence alone and against the CPU reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.h>

#include "logit_compare.hpp"
#include "step_seq.hpp"

namespace ehtest {

// Logits of sequence i at position p: [i][p], empty where none was asked.
using SeqLogits = std::vector<std::vector<std::vector<float>>>;

// The first `prompt` tokens of each sequence in chunks of `chunk` (0:
// whole), then one token a step, every sequence that still has tokens in
// every step. `only` (>= 0) feeds that sequence alone. Every entry asks for
// logits; the sequences are made on `m` (and released with it).
inline SeqLogits feed(StepModel& m, const std::vector<std::vector<int32_t>>& toks, size_t prompt, uint32_t chunk,
                      int only = -1) {
    SeqLogits out(toks.size());
    std::vector<eh_seq*> s(toks.size(), nullptr);
    std::vector<size_t> fed(toks.size(), 0);
    for (size_t i = 0; i < toks.size(); ++i) {
        out[i].resize(toks[i].size());
        if (only < 0 || size_t(only) == i) s[i] = m.create();
        else fed[i] = toks[i].size();
    }
    for (int guard = 0; guard < 10000; ++guard) {
        std::vector<eh_step_entry> es;
        std::vector<size_t> who;
        for (size_t i = 0; i < toks.size(); ++i) {
            if (fed[i] == toks[i].size()) continue;
            const size_t p = std::min(prompt, toks[i].size());
            size_t k = 1;
            if (fed[i] < p) k = chunk ? std::min<size_t>(chunk, p - fed[i]) : p - fed[i];
            es.push_back(step_entry(s[i], toks[i].data() + fed[i], uint32_t(k)));
            who.push_back(i);
            fed[i] += k;
        }
        if (es.empty()) break;
        EXPECT_EQ(m.api->step(m.model, es.data(), uint32_t(es.size())), EH_OK) << m.error();
        for (size_t j = 0; j < es.size(); ++j) out[who[j]][fed[who[j]] - 1] = m.logits(s[who[j]]);
    }
    return out;
}

// Mixed steps' logits tallied against the reference's (rel_err within tol,
// the top-1 kept within tol; positions from past_from on also apart) and
// against each sequence's own logits alone (within tol, the same top-1).
struct MixTally {
    double tol = 1e-2;
    size_t past_from = 0;
    std::vector<double> errs;  // each position's rel_err against the reference
    size_t n_ref = 0, ref_ok = 0, ref_top1 = 0, past = 0, past_ok = 0, n_alone = 0, alone_ok = 0, alone_top1 = 0;

    void against_reference(const SeqLogits& got, const SeqLogits& ref) {
        for (size_t i = 0; i < got.size(); ++i)
            for (size_t p = 0; p < got[i].size(); ++p) {
                if (got[i][p].empty()) continue;
                const double e = rel_err(got[i][p], ref[i][p]);
                errs.push_back(e);
                ++n_ref;
                ref_ok += e < tol;
                ref_top1 += top1_ok(got[i][p], ref[i][p], tol);
                if (p >= past_from) {
                    ++past;
                    past_ok += e < tol;
                }
            }
    }
    void against_alone(const SeqLogits& mixed, const SeqLogits& alone) {
        for (size_t i = 0; i < mixed.size(); ++i)
            for (size_t p = 0; p < mixed[i].size(); ++p) {
                if (mixed[i][p].empty() || alone[i][p].empty()) continue;
                ++n_alone;
                alone_ok += rel_err(mixed[i][p], alone[i][p]) < tol;
                alone_top1 += argmax(mixed[i][p]) == argmax(alone[i][p]);
            }
    }
    // Sorts errs and prints the tally: "[tag] name: ..., positions >= past_what: ...".
    void report(const char* tag, const std::string& name, const char* past_what) {
        std::sort(errs.begin(), errs.end());
        std::printf("[%s] %s: vs cpu-reference %zu positions, within %.0e: %zu, top-1 ok: %zu, median %.3g, "
                    "max %.3g; positions >= %s: %zu of %zu within; mixed vs alone: %zu positions, within: %zu, "
                    "same top-1: %zu\n",
                    tag, name.c_str(), n_ref, tol, ref_ok, ref_top1, errs[errs.size() / 2], errs.back(), past_what,
                    past_ok, past, n_alone, alone_ok, alone_top1);
    }
    // After report: the median error under 3e-3; 97 % of the positions
    // within tol of the reference and keeping its top-1 (95 % of those past
    // past_from within); 99 % of the mixed positions within tol of alone and
    // with the same top-1.
    void expect_agreement() const {
        EXPECT_LT(errs[errs.size() / 2], 3e-3) << "median error";
        EXPECT_GE(double(ref_ok), 0.97 * double(n_ref)) << "within tol of the reference";
        EXPECT_GE(double(ref_top1), 0.97 * double(n_ref)) << "the reference's top-1";
        EXPECT_GE(double(past_ok), 0.95 * double(past)) << "within tol past " << past_from;
        EXPECT_GE(double(alone_ok), 0.99 * double(n_alone)) << "mixed within tol of alone";
        EXPECT_GE(double(alone_top1), 0.99 * double(n_alone)) << "mixed top-1 as alone";
    }
};

}  // namespace ehtest
