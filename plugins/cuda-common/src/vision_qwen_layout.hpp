// The order Qwen2.5-VL's tower runs an image's patches in on the GPU
// (vision_qwen.cpp), host only: windows of `window` x `window` merged 2 x 2
// squares row by row from the top-left corner (cut by the edges), the
// squares row by row inside each, a square's four patches row-major -- so
// each window is a run of rows (the flash pass's segments) and each
// square's four rows are consecutive (the merger's input). The window a
// patch is in is cpu-reference's (its row and column over the window's
// side in patches). Tested by tests/cuda/qwen_window_layout_test.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace ehcuda::vision::qwen {

struct WindowLayout {
    std::vector<int32_t> rc;    // per patch in run order: its row and column in the patch grid
    std::vector<int32_t> win;   // per patch: its window
    std::vector<int32_t> seg;   // windows + 1 ascending: window w is patches seg[w] .. seg[w + 1] - 1
    std::vector<int32_t> unit;  // per square in run order: its tile (row-major over the squares)
    int max_rows = 0;           // the most patches of a window
};

// gh x gw patches (both even), windows of `window` squares a side.
inline WindowLayout window_layout(int gh, int gw, int window) {
    WindowLayout L;
    const int uh = gh / 2, uw = gw / 2;
    L.rc.reserve(size_t(gh) * gw * 2);
    L.seg.push_back(0);
    for (int wy = 0; wy < uh; wy += window)
        for (int wx = 0; wx < uw; wx += window) {
            const int w = int(L.seg.size()) - 1;
            for (int uy = wy; uy < std::min(wy + window, uh); ++uy)
                for (int ux = wx; ux < std::min(wx + window, uw); ++ux) {
                    for (int in = 0; in < 4; ++in) {
                        L.rc.push_back(2 * uy + in / 2);
                        L.rc.push_back(2 * ux + in % 2);
                        L.win.push_back(w);
                    }
                    L.unit.push_back(uy * uw + ux);
                }
            L.max_rows = std::max(L.max_rows, int(L.unit.size()) * 4 - L.seg.back());
            L.seg.push_back(int(L.unit.size()) * 4);
        }
    return L;
}

}  // namespace ehcuda::vision::qwen
