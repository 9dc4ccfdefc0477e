// llama-cuda's M-RoPE bookkeeping (plugins/llama-cuda/src/mrope_positions.hpp):
// each token's shift from its KV index, by hand from the rules of
// engine_host/mrope.hpp (cpu-reference's QwenVlDecoder tests check those
// rules against transformers), across steps, truncations (stale entries),
// forks, parked copies and a step refused after placing. Host only.
#include <gtest/gtest.h>

#include <array>
#include <vector>

#include "mrope_positions.hpp"

namespace {

using llama_cuda::MropePositions;
using Shift = MropePositions::Shift;

std::array<int32_t, 3> of(const Shift& s) { return {s.c[0], s.c[1], s.c[2]}; }
std::array<int32_t, 3> same(int32_t d) { return {d, d, d}; }

// 10 tokens from KV index 0: two text, an image of 2 rows x 3 columns at
// index 2 (text position 2), two text. The image's token (r, c) sits at
// (2, 2 + r, 2 + c); its largest component is 2 + 2 = 4, so the text after
// it continues at 5 (KV index 8): shift -3.
struct Placed {
    MropePositions m;
    int seq = 0;  // its address is the sequence's key
    std::vector<Shift> s = std::vector<Shift>(10);
    bool any = false;
    Placed() {
        const eh_embd_span img{2, 6, EH_SPAN_GRID, 3, nullptr};
        any = m.place(&seq, 0, 10, &img, 1, s.data());
    }
};

TEST(MropePositions, TextAloneShiftsNothingAndKeepsNothing) {
    MropePositions m;
    int seq = 0;
    std::vector<Shift> s(5);
    EXPECT_FALSE(m.place(&seq, 7, 5, nullptr, 0, s.data()));
    for (const Shift& x : s) EXPECT_EQ(of(x), same(0));
    EXPECT_FALSE(m.tracks(&seq));
    EXPECT_EQ(m.next_position(&seq, 12), 12);
    // A span that is not a grid (Gemma 3's bidirectional one) is text positions.
    const eh_embd_span flat{1, 3, EH_SPAN_BIDIRECTIONAL, 0, nullptr};
    EXPECT_FALSE(m.place(&seq, 0, 5, &flat, 1, s.data()));
    EXPECT_FALSE(m.tracks(&seq));
}

TEST(MropePositions, AnImageOnItsGrid) {
    Placed p;
    EXPECT_TRUE(p.any);
    const std::vector<std::array<int32_t, 3>> want = {
        same(0), same(0),                   // text 0, 1
        {0, 0, 0},   {-1, -1, 0}, {-2, -2, 0},   // row 0: (2, 2, 2), (2, 2, 3), (2, 2, 4) at 2, 3, 4
        {-3, -2, -3}, {-4, -3, -3}, {-5, -4, -3},  // row 1: (2, 3, 2), (2, 3, 3), (2, 3, 4) at 5, 6, 7
        same(-3), same(-3)};                // text 5, 6 at 8, 9
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(of(p.s[i]), want[i]) << "token " << i;
    EXPECT_EQ(p.m.next_position(&p.seq, 10), 7);
}

TEST(MropePositions, LaterStepsKeepTheShift) {
    Placed p;
    std::vector<Shift> s(3);
    EXPECT_TRUE(p.m.place(&p.seq, 10, 3, nullptr, 0, s.data()));
    for (const Shift& x : s) EXPECT_EQ(of(x), same(-3));
    EXPECT_EQ(p.m.next_position(&p.seq, 13), 10);
}

TEST(MropePositions, TruncationsIntoAndBeforeTheImage) {
    Shift s;
    {
        // Cut after the image's token (0, 2) (KV 5): the largest component
        // so far is 4, so the next text position is 5: shift 0 at KV 5.
        Placed p;
        EXPECT_EQ(p.m.next_position(&p.seq, 5), 5);
        EXPECT_FALSE(p.m.place(&p.seq, 5, 1, nullptr, 0, &s));
        EXPECT_EQ(of(s), same(0));
    }
    {
        // Cut after row 1's first token (KV 6): largest 4 again, 5 at KV 6.
        Placed p;
        EXPECT_EQ(p.m.next_position(&p.seq, 6), 5);
        EXPECT_TRUE(p.m.place(&p.seq, 6, 1, nullptr, 0, &s));
        EXPECT_EQ(of(s), same(-1));
    }
    {
        // Before the image: text positions again, and the image placed
        // anew from there (the entries past the cut were stale); the text
        // after it takes its shift again.
        Placed p;
        EXPECT_EQ(p.m.next_position(&p.seq, 2), 2);
        const eh_embd_span img{0, 6, EH_SPAN_GRID, 3, nullptr};
        std::vector<Shift> again(8);
        EXPECT_TRUE(p.m.place(&p.seq, 2, 8, &img, 1, again.data()));
        for (size_t i = 0; i < 8; ++i) EXPECT_EQ(of(again[i]), of(p.s[2 + i])) << "token " << i;
        EXPECT_EQ(p.m.next_position(&p.seq, 9), 6);
    }
}

TEST(MropePositions, AStepPlacedThenRefusedChangesNothingThatIsRead) {
    // place() runs before the step's checks; a refused step leaves the
    // sequence's length as it was, so its entries are stale and the next
    // placement from the same length gives the same shifts.
    Placed p;
    const eh_embd_span img{0, 4, EH_SPAN_GRID, 2, nullptr};
    std::vector<Shift> a(6), b(6);
    p.m.place(&p.seq, 10, 6, &img, 1, a.data());
    p.m.place(&p.seq, 10, 6, &img, 1, b.data());
    for (size_t i = 0; i < 6; ++i) EXPECT_EQ(of(a[i]), of(b[i]));
    EXPECT_EQ(p.m.next_position(&p.seq, 10), 7);
}

TEST(MropePositions, ForksCopyThePrefix) {
    Placed p;
    int fork_in = 0, fork_after = 0, text = 0, text_fork = 0;
    p.m.fork(&p.seq, &fork_in, 6);  // inside the image, row 1's first token in
    p.m.fork(&p.seq, &fork_after, 10);
    EXPECT_EQ(p.m.next_position(&fork_in, 6), 5);
    EXPECT_EQ(p.m.next_position(&fork_after, 10), 7);
    Shift s;
    p.m.place(&fork_after, 10, 1, nullptr, 0, &s);
    EXPECT_EQ(of(s), same(-3));
    // The source goes on unchanged by its forks' steps.
    p.m.place(&fork_in, 6, 1, nullptr, 0, &s);
    EXPECT_EQ(p.m.next_position(&p.seq, 7), 5);  // KV 6 still the image's token (1, 0)
    // A fork of a sequence that never held an image keeps nothing; a
    // fork into a key that held positions clears them.
    p.m.fork(&text, &text_fork, 0);
    EXPECT_FALSE(p.m.tracks(&text_fork));
    p.m.fork(&text, &fork_in, 0);
    EXPECT_FALSE(p.m.tracks(&fork_in));
    p.m.forget(&p.seq);
    EXPECT_FALSE(p.m.tracks(&p.seq));
    EXPECT_EQ(p.m.next_position(&p.seq, 10), 10);
}

TEST(MropePositions, AParkedCopyKeepsItsPositions) {
    Placed p;
    int parked = 0, back = 0, text = 0;
    p.m.park(&p.seq, 10, &parked);
    p.m.forget(&p.seq);
    p.m.unpark(&parked, &back);
    EXPECT_EQ(p.m.next_position(&back, 10), 7);
    // The same handle parked again from a text-only sequence: its older
    // copy's positions are gone.
    p.m.park(&text, 4, &parked);
    int back2 = 0;
    p.m.unpark(&parked, &back2);
    EXPECT_FALSE(p.m.tracks(&back2));
    EXPECT_EQ(p.m.next_position(&back2, 4), 4);
}

}  // namespace
