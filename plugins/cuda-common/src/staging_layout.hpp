// Where each piece of a batched step's inputs sits in its staging slot
// (batch.cpp): host only, no CUDA calls.
#pragma once

#include <cstddef>

#include "ehcuda/sampler.hpp"

namespace ehcuda {

inline size_t staging_align16(size_t n) { return (n + 15) / 16 * 16; }

// Where each piece of a step's inputs sits in the staging buffers. What the
// forward pass reads (tokens .. tables) sits at offsets fixed by the
// capacities, so a captured graph finds it at the same addresses every step.
// The biases and masks (read only outside the graphs) follow the step's
// block ids directly (biases_after), so a step's inputs go up in one copy,
// [0, Biases::end); their room after the block ids' capacity keeps `out`
// where a plain step's graph found it.
struct StagingLayout {
    size_t tokens, pos, rows, table, lora, out_idx, hid_idx, chain, params, counters, edits, tables, out, end;
    size_t ne, nm;  // the step's bias entries and mask words
    struct Biases {
        size_t etok, eval, masks, end;  // end: of the step's inputs
    };
    // Where the biases and masks sit after the step's n_tables block ids.
    Biases biases_after(size_t n_tables) const {
        Biases b;
        b.etok = tables + staging_align16(n_tables * 4);
        b.eval = b.etok + staging_align16(ne * 4);
        b.masks = b.eval + staging_align16(ne * 4);
        b.end = ne || nm ? b.masks + nm * 4 : tables + n_tables * 4;
        return b;
    }
    StagingLayout(size_t Tcap, size_t Rcap, size_t Bcap, size_t NE, size_t NM) : ne(NE), nm(NM) {
        size_t at = 0;
        auto take = [&](size_t bytes) {
            const size_t o = at;
            at += staging_align16(bytes);
            return o;
        };
        tokens = take(Tcap * 4);
        pos = take(Tcap * 4);
        rows = take(Tcap * 4);
        table = take(Tcap * 4);
        lora = take(Tcap * 4);  // each token's LoRA adapter slot, -1: none
        out_idx = take(Rcap * 4);
        hid_idx = take(Rcap * 4);  // EH_STEP_HIDDEN entries: at most max_step_entries <= Rcap
        chain = take(Rcap * 8);  // (token index, row of the step before) per chained entry
        params = take(Rcap * sizeof(SamplerParams));
        counters = take(Rcap * sizeof(unsigned long long));
        edits = take(Rcap * sizeof(RowEdits));
        tables = take(Bcap * 4);
        take(NE * 4);  // room for the biases and masks: the most biases_after needs past the block ids
        take(NE * 4);
        take(NM * 4);
        out = take(Rcap * 4);  // host only: the sampled ids, copied back from the device
        end = at;
    }
};

}  // namespace ehcuda
