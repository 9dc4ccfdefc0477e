// The patch order of Qwen2.5-VL's tower on the GPU
// (plugins/cuda-common/src/vision_qwen_layout.hpp), host only: every patch
// once; each window a run of rows holding exactly the patches
// cpu-reference's vision_qwen.cpp puts in that window (row / side, column /
// side in patches); each 2 x 2 square's four patches consecutive and
// row-major, as the merger reads them; each square's tile index; the
// largest window's rows. Grids of one window, of whole windows, and cut by
// both edges.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "vision_qwen_layout.hpp"

namespace {

using ehcuda::vision::qwen::window_layout;

void check(int gh, int gw, int window) {
    SCOPED_TRACE(std::to_string(gh) + "x" + std::to_string(gw) + " patches, windows of " + std::to_string(window));
    const auto L = window_layout(gh, gw, window);
    const int N = gh * gw, side = 2 * window;  // a window's side in patches
    ASSERT_EQ(L.rc.size(), size_t(2 * N));
    ASSERT_EQ(L.win.size(), size_t(N));
    ASSERT_EQ(L.unit.size(), size_t(N / 4));
    std::set<std::pair<int, int>> seen;
    for (int t = 0; t < N; ++t) {
        const int r = L.rc[2 * t], c = L.rc[2 * t + 1];
        ASSERT_TRUE(r >= 0 && r < gh && c >= 0 && c < gw);
        EXPECT_TRUE(seen.insert({r, c}).second) << "patch " << r << "," << c << " twice";
    }
    // cpu-reference's window of each patch, numbered row by row.
    const int wx = (gw + side - 1) / side;
    std::map<int, std::set<std::pair<int, int>>> want;
    for (int r = 0; r < gh; ++r)
        for (int c = 0; c < gw; ++c) want[(r / side) * wx + c / side].insert({r, c});
    ASSERT_EQ(L.seg.size(), want.size() + 1);
    int max_rows = 0;
    for (size_t w = 0; w + 1 < L.seg.size(); ++w) {
        std::set<std::pair<int, int>> got;
        for (int t = L.seg[w]; t < L.seg[w + 1]; ++t) {
            got.insert({L.rc[2 * t], L.rc[2 * t + 1]});
            EXPECT_EQ(L.win[size_t(t)], int(w));
        }
        EXPECT_EQ(got, want[int(w)]) << "window " << w;
        max_rows = std::max(max_rows, L.seg[w + 1] - L.seg[w]);
    }
    EXPECT_EQ(L.seg.back(), N);
    EXPECT_EQ(L.max_rows, max_rows);
    // Squares: four consecutive rows, (0,0) (0,1) (1,0) (1,1) of one square,
    // whose tile index is unit[j].
    for (int j = 0; j < N / 4; ++j) {
        const int r0 = L.rc[8 * j], c0 = L.rc[8 * j + 1];
        EXPECT_EQ(r0 % 2, 0);
        EXPECT_EQ(c0 % 2, 0);
        for (int in = 0; in < 4; ++in) {
            EXPECT_EQ(L.rc[8 * j + 2 * in], r0 + in / 2);
            EXPECT_EQ(L.rc[8 * j + 2 * in + 1], c0 + in % 2);
        }
        EXPECT_EQ(L.unit[size_t(j)], (r0 / 2) * (gw / 2) + c0 / 2);
    }
}

TEST(QwenWindowLayout, OneWindow) { check(4, 4, 4); }
TEST(QwenWindowLayout, WholeWindows) { check(16, 32, 4); }
TEST(QwenWindowLayout, CutByBothEdges) { check(10, 14, 4); }
TEST(QwenWindowLayout, RealShape) { check(64, 48, 4); }

}  // namespace
