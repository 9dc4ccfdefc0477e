// The LoRA update kernels (LoraStep::apply's kernel path, lora.cu) against
// host math: rows of several adapters (and none) in one launch, each
// adapter's rows taken together, ranks that are not a multiple of the rank
// tile and above it, more rows of one adapter than one block's row tiles,
// inputs that are not column pairs, the SwiGLU input form, rows picked
// through row_token; and each row's result bitwise the one it gets alone.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <ehcuda/lora.hpp>

#include "gpu_util.hpp"

namespace ehtest {
namespace {

struct Pair {
    int rank = 0;
    float scale = 0.0f;
    std::vector<__half> a, bt;  // a: rank x n_in; bt: rank x n_out
    ehcuda::DeviceBuffer da, dbt;
};

struct LoraCase {
    int n_in, n_outs[3], nparts;
    bool swiglu;
    bool row_token;
};

class LoraKernel : public ::testing::TestWithParam<LoraCase> {};

float silu_mul(float g, float u) { return g / (1.0f + std::exp(-g)) * u; }

TEST_P(LoraKernel, GroupedRowsMatchHostMathAndEachRowAlone) {
    REQUIRE_GPU();
    const LoraCase c = GetParam();
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> U(-1.0f, 1.0f);
    // Sites: nparts of them reading the same input, side by side in y.
    std::vector<ehcuda::LoraSite> sites;
    int n_out = 0;
    for (int p = 0; p < c.nparts; ++p) {
        sites.push_back({c.n_in, c.n_outs[p], n_out});
        n_out += c.n_outs[p];
    }
    ehcuda::LoraSet set;
    set.init(sites, nullptr);
    // Adapters: slot ranks per part (0: no pair at that part's site).
    const int ranks[4][3] = {{16, 16, 16}, {5, 0, 40}, {33, 7, 0}, {1, 16, 17}};
    std::vector<std::vector<Pair>> pairs(4);
    std::vector<int> slots;
    for (int ad = 0; ad < 4; ++ad) {
        const int slot = set.claim();
        slots.push_back(slot);
        std::vector<ehcuda::LoraDesc> descs(size_t(c.nparts));
        pairs[size_t(ad)].resize(size_t(c.nparts));
        for (int p = 0; p < c.nparts; ++p) {
            Pair& pr = pairs[size_t(ad)][size_t(p)];
            pr.rank = ranks[ad][p];
            if (!pr.rank) continue;
            pr.scale = 0.5f + 0.25f * float(ad);
            pr.a.resize(size_t(pr.rank) * size_t(c.n_in));
            pr.bt.resize(size_t(pr.rank) * size_t(c.n_outs[p]));
            for (__half& v : pr.a) v = __float2half(U(rng) * 0.1f);
            for (__half& v : pr.bt) v = __float2half(U(rng));
            pr.da = to_device(pr.a);
            pr.dbt = to_device(pr.bt);
            descs[size_t(p)] = {pr.da.as<const __half>(), pr.dbt.as<const __half>(), pr.rank, pr.scale};
        }
        set.write(slot, descs);
    }
    // 45 rows: adapter 0 takes 21 (more than an expand block's 16 and a
    // shrink's 4 at a time), the others fewer, some rows none.
    const int nrows = 45;
    std::vector<int32_t> token_slot(nrows), row_token;
    for (int r = 0; r < nrows; ++r) {
        const int k = r % 9;
        token_slot[size_t(r)] = k < 4 ? slots[0] : k == 4 ? slots[1] : k == 5 ? -1 : k == 6 ? slots[2] : slots[3];
    }
    const int ntok = nrows;
    if (c.row_token) {  // rows reversed: row r is token ntok - 1 - r
        for (int r = 0; r < nrows; ++r) row_token.push_back(ntok - 1 - r);
    }
    const int ldx = c.swiglu ? 2 * c.n_in + 2 : c.n_in + (c.n_in % 2 ? 0 : 2);
    const int ldy = n_out + 3;
    std::vector<float> x(size_t(nrows) * size_t(ldx)), y0(size_t(nrows) * size_t(ldy));
    for (float& v : x) v = U(rng);
    for (float& v : y0) v = U(rng);
    // Host: y = y0 + s * B (A x) per row's adapter, in double.
    std::vector<double> want(y0.begin(), y0.end());
    for (int r = 0; r < nrows; ++r) {
        const int slot = token_slot[size_t(c.row_token ? row_token[size_t(r)] : r)];
        if (slot < 0) continue;
        const int ad = int(std::find(slots.begin(), slots.end(), slot) - slots.begin());
        for (int p = 0; p < c.nparts; ++p) {
            const Pair& pr = pairs[size_t(ad)][size_t(p)];
            for (int k = 0; k < pr.rank; ++k) {
                double u = 0;
                for (int i = 0; i < c.n_in; ++i) {
                    const float* row = &x[size_t(r) * size_t(ldx)];
                    const double xi = c.swiglu ? silu_mul(row[i], row[i + c.n_in]) : row[i];
                    u += double(__half2float(pr.a[size_t(k) * size_t(c.n_in) + size_t(i)])) * xi;
                }
                for (int j = 0; j < c.n_outs[p]; ++j)
                    want[size_t(r) * size_t(ldy) + size_t(sites[size_t(p)].col0 + j)] +=
                        pr.scale * u * double(__half2float(pr.bt[size_t(k) * size_t(c.n_outs[p]) + size_t(j)]));
            }
        }
    }
    ehcuda::DeviceBuffer dx = to_device(x), dy = to_device(y0), dslot = to_device(token_slot);
    ehcuda::DeviceBuffer drow = to_device(c.row_token ? row_token : std::vector<int32_t>{0});
    ehcuda::LoraStep step;
    auto run = [&](const ehcuda::DeviceBuffer& slot_buf) {
        std::initializer_list<int> all{0, 1, 2};
        std::initializer_list<int> two{0, 1};
        std::initializer_list<int> one{0};
        step.apply(set, c.nparts == 3 ? all : c.nparts == 2 ? two : one, slot_buf.as<const int32_t>(),
                   c.row_token ? drow.as<const int32_t>() : nullptr, nrows, dx.as<const float>(), ldx, dy.as<float>(), ldy,
                   nullptr, nullptr, nullptr, 0, nullptr, c.swiglu);
    };
    run(dslot);
    const std::vector<float> got = to_host<float>(dy, y0.size());
    double worst = 0, big = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
        big = std::max(big, std::fabs(want[i]));
    }
    EXPECT_LT(worst, 1e-4 * std::max(1.0, big)) << "largest |y| " << big;
    // Each row alone (every other row's slot -1): the same bits.
    for (int r : {0, 4, 9, 44}) {
        std::vector<int32_t> alone(size_t(ntok), -1);
        const int t = c.row_token ? row_token[size_t(r)] : r;
        alone[size_t(t)] = token_slot[size_t(t)];
        ehcuda::DeviceBuffer da = to_device(alone);
        cudaMemcpy(dy.get(), y0.data(), y0.size() * sizeof(float), cudaMemcpyHostToDevice);
        run(da);
        const std::vector<float> one = to_host<float>(dy, y0.size());
        for (int j = 0; j < n_out; ++j)
            ASSERT_EQ(one[size_t(r) * size_t(ldy) + size_t(j)], got[size_t(r) * size_t(ldy) + size_t(j)])
                << "row " << r << " column " << j;
    }
    GPU_OK(cudaGetLastError());
}

INSTANTIATE_TEST_SUITE_P(Shapes, LoraKernel,
                         ::testing::Values(LoraCase{4096, {512, 128, 128}, 3, false, false},  // q/k/v-like
                                           LoraCase{2304, {700, 700, 0}, 2, false, true},     // gate/up-like, LM head rows
                                           LoraCase{1000, {300, 0, 0}, 1, true, false},       // down with SwiGLU
                                           LoraCase{777, {96, 0, 0}, 1, false, false}));      // odd input: no pairs

}  // namespace
}  // namespace ehtest
