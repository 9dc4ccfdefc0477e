// The batched step's staging layout (staging_layout.hpp, host code): one
// copy from offset 0 takes a step's inputs whatever its block ids, biases
// and masks (the biases and masks follow the block ids, padding below 16
// bytes between pieces), never reaching the sampled ids; and what a
// captured graph reads or writes stays where a plain step had it.
#include <gtest/gtest.h>

#include "staging_layout.hpp"

namespace {

using ehcuda::StagingLayout;

TEST(StagingLayout, OneCopyTakesAStepsInputs) {
    const size_t Tcap = 512, Rcap = 64, Bcap = 64 * 512 + 1;
    const StagingLayout plain(Tcap, Rcap, Bcap, 0, 0);
    for (const size_t ne : {0, 1, 7, 300})
        for (const size_t nm : {0, 5, 4096}) {
            const StagingLayout L(Tcap, Rcap, Bcap, ne, nm);
            // the forward pass's inputs where a captured graph found them
            EXPECT_EQ(L.tokens, plain.tokens);
            EXPECT_EQ(L.chain, plain.chain);
            EXPECT_EQ(L.edits, plain.edits);
            EXPECT_EQ(L.tables, plain.tables);
            EXPECT_GE(L.out, plain.out);
            EXPECT_LE(L.out + Rcap * 4, L.end);
            for (const size_t n : {size_t(0), size_t(1), size_t(3), size_t(4), size_t(100), Bcap}) {
                const StagingLayout::Biases b = L.biases_after(n);
                const size_t ids_end = L.tables + n * 4;
                EXPECT_GE(b.etok, ids_end);
                EXPECT_LT(b.etok, ids_end + 16) << n << " block ids";
                EXPECT_GE(b.eval, b.etok + ne * 4);
                EXPECT_LT(b.eval, b.etok + ne * 4 + 16);
                EXPECT_GE(b.masks, b.eval + ne * 4);
                EXPECT_LT(b.masks, b.eval + ne * 4 + 16);
                EXPECT_EQ(b.end, ne || nm ? b.masks + nm * 4 : ids_end);
                EXPECT_LE(b.end, L.out) << "the upload reaches the sampled ids";
                EXPECT_EQ(b.etok % 16, 0u);
                EXPECT_EQ(b.masks % 4, 0u);
            }
        }
}

}  // namespace
