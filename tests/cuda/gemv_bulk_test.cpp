// The bulk-copy GEMV (weights copied to shared memory per warp tile) against
// the register-streaming GEMV it replaces for single-token integer inputs
// (and its one-token slice ring, bulk_slices, against both):
// bitwise the same outputs for every integer-path type, input form and
// staging mode (the RMSNorm fold to the last bits of its 1/rms factor), with tiles that end mid-tensor, at a tensor end that is not
// 16-byte aligned (weights allocated to the byte, so an over-read shows
// under compute-sanitizer), with biases, accumulation and several segments.
#include <cmath>
#include <cstring>
#include <string>
#include <random>

#include <engine_host/plugin_abi.hpp>
#include <ehcuda/kernels.hpp>
#include <ehcuda/prefill_workspace.hpp>

#include "gpu_util.hpp"
#include "host_reference.hpp"

namespace ehtest {
namespace {

// Exactly `bytes` of device memory (to_device pads by 16).
ehcuda::DeviceBuffer exact_device(const std::vector<uint8_t>& v) {
    ehcuda::DeviceBuffer b(v.size());
    cudaMemcpy(b.get(), v.data(), v.size(), cudaMemcpyHostToDevice);
    return b;
}

// Integer chunks as a producer writes them (gemv_stage.cuh's layout):
// int16 codes (Bits 32: then int8 residue codes), then the scale and the
// code sums of each half (Bits 32: then the residue sums of the two halves
// as two int16 in one word).
std::vector<uint8_t> host_chunks(int n, int bits, std::mt19937& rng) {
    const int stride = bits == 16 ? 80 : 112, code_bytes = bits == 16 ? 64 : 96;
    std::vector<uint8_t> out(size_t(n / 32) * stride, 0);
    std::uniform_int_distribution<int> code(-32767, 32767), res(-128, 127);
    std::uniform_real_distribution<float> scale(1e-5f, 1e-3f);
    for (int c = 0; c < n / 32; ++c) {
        uint8_t* ch = out.data() + size_t(c) * stride;
        int16_t q[32];
        int8_t r[32];
        int sum[2] = {0, 0}, rsum[2] = {0, 0};
        for (int j = 0; j < 32; ++j) {
            q[j] = int16_t(code(rng));
            r[j] = int8_t(bits == 32 ? res(rng) : 0);
            sum[j / 16] += q[j];
            rsum[j / 16] += r[j];
        }
        std::memcpy(ch, q, 64);
        if (bits == 32) std::memcpy(ch + 64, r, 32);
        const float d = scale(rng);
        const int16_t rs[2] = {int16_t(rsum[0]), int16_t(rsum[1])};
        int hdr[4] = {0, sum[0], sum[1], 0};
        std::memcpy(&hdr[0], &d, 4);
        std::memcpy(&hdr[3], rs, 4);
        std::memcpy(ch + code_bytes, hdr, bits == 32 ? 16 : 12);
    }
    return out;
}

struct Shape {
    int rows, cols;
};

// The one-token slice ring's plan keys for a run (bulk_slices 0: off).
struct Slices {
    int slices = 0, slots = 2, rows = 0, warps = 0;
};
// The slice ring forms the tests compare: by the matrix, then two rows a
// warp with every slot and narrower blocks, then one row with three slots
// and 4-warp blocks (every warp count, row count and slot count taken).
const Slices kSliceForms[] = {{2, 2, 0, 0}, {2, 4, 2, 8}, {2, 3, 1, 4}};

// One single-token GEMV, bulk or not; returns y. The register kernel's
// aligned word loads may read up to 3 bytes past a tensor's end (the
// plugins' weight arenas leave room): it gets `padded` weights, the bulk
// kernel the exact ones.
std::vector<float> run(const ehcuda::MatmulArgs& a, bool bulk, const std::vector<float>& y0,
                       const void* padded = nullptr, int ring_waves = 0, Slices sl = {}) {
    BulkGuard g(bulk);
    const ehcuda::KernelPlan was = test_plan();
    ehtest::set_gemv_bulk_ring(ring_waves);
    test_plan().bulk_slices = sl.slices;
    test_plan().bulk_slice_slots = sl.slots;
    test_plan().bulk_slice_rows = sl.rows;
    test_plan().bulk_slice_warps = sl.warps;
    auto dy = to_device(y0);
    ehcuda::MatmulArgs m = a;
    if (!bulk && padded) m.seg[0].w.data = padded;
    m.y = dy.as<float>();
    ehcuda::matmul(m, nullptr);
    test_plan() = was;
    return to_host<float>(dy, y0.size());
}

// The first launch of a's route under the installed plan with the slice
// ring's keys `sl` (so a test knows it ran the form it names).
ehcuda::BulkLaunch routed_bulk(const ehcuda::MatmulArgs& a, Slices sl) {
    const ehcuda::KernelPlan was = test_plan();
    test_plan().bulk_slices = sl.slices;
    test_plan().bulk_slice_slots = sl.slots;
    test_plan().bulk_slice_rows = sl.rows;
    test_plan().bulk_slice_warps = sl.warps;
    ehcuda::MatmulShape m;
    m.g.nseg = a.nseg;
    for (int s = 0; s < a.nseg; ++s) {
        m.g.type[s] = a.seg[s].w.type;
        m.g.rows[s] = a.seg[s].w.rows;
        m.g.row_bytes[s] = a.seg[s].w.row_bytes;
    }
    m.g.cols = a.cols;
    m.chunk_input = a.xmode == ehcuda::XMode::Chunks;
    m.rms_norm = a.xmode == ehcuda::XMode::RmsNorm;
    int sms = 0, major = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    const ehcuda::BulkLaunch b = ehcuda::route_matmul(ehcuda::plan(), ehcuda::DeviceTraits{major, 0, sms}, m).launch[0].bulk;
    test_plan() = was;
    return b;
}

TEST(GemvBulk, BitwiseEqualToRegisterStreaming) {
    REQUIRE_GPU();
    // Shapes the register kernel serves without split-K (so the two sum in
    // the same order): tiny with a ragged tensor end, one and several rows per
    // tile, 2- and 4-row warps of the register kernel, a long-K matrix, and
    // one of more tiles than twice the warps a device holds (the resident
    // grid's warps refill their buffers).
    const Shape shapes[] = {{37, 96}, {300, 1024}, {4100, 640}, {8192, 1024}, {3072, 8192}, {70001, 256}};
    const uint32_t types[] = {EH_TYPE_Q4_0, EH_TYPE_Q4_1, EH_TYPE_Q5_0, EH_TYPE_Q5_1,
                              EH_TYPE_Q8_0, EH_TYPE_Q4_K, EH_TYPE_Q5_K, EH_TYPE_Q6_K,
                              EH_TYPE_Q2_K, EH_TYPE_Q3_K, EH_TYPE_IQ4_NL, EH_TYPE_IQ4_XS};
    int checked = 0;
    for (const Shape& sh : shapes)
        for (uint32_t type : types) {
            const size_t rb = ehcuda::row_bytes(type, sh.cols);
            if (rb == 0) continue;  // K-quants need whole 256-element blocks
            std::mt19937 rng(type * 7 + uint32_t(sh.rows));
            const auto host_w = random_rows(type, sh.rows, sh.cols, rng);
            auto w = exact_device(host_w), w_padded = to_device(host_w);
            std::normal_distribution<float> nd;
            std::vector<float> x(size_t(2 * sh.cols)), nw(size_t(sh.cols)), bias(size_t(sh.rows)),
                y0(size_t(sh.rows));
            for (auto& v : x) v = 2 * nd(rng);
            for (auto& v : nw) v = 1 + 0.3f * nd(rng);
            for (auto& v : bias) v = nd(rng);
            for (auto& v : y0) v = nd(rng);
            auto dx = to_device(x), dn = to_device(nw), db = to_device(bias);
            for (auto in : {ehcuda::GemvInput::Int16, ehcuda::GemvInput::Int16x2}) {
                InputGuard ig(in);
                auto dc = to_device(host_chunks(sh.cols, in == ehcuda::GemvInput::Int16 ? 16 : 32, rng));
                for (int mode = 0; mode < 4; ++mode) {
                    ehcuda::MatmulArgs a;
                    a.seg[0].w = {w.get(), type, sh.rows, sh.cols, rb};
                    a.seg[0].bias = mode == 1 ? db.as<float>() : nullptr;
                    a.cols = sh.cols;
                    a.x = mode == 3 ? static_cast<const float*>(dc.get()) : dx.as<float>();
                    a.ldx = mode == 2 ? 2 * sh.cols : sh.cols;
                    a.xmode = mode == 0 ? ehcuda::XMode::Plain
                              : mode == 1 ? ehcuda::XMode::RmsNorm
                              : mode == 2 ? ehcuda::XMode::SwiGLU
                                          : ehcuda::XMode::Chunks;
                    a.norm_w = dn.as<float>();
                    a.norm_eps = 1e-5f;
                    a.ldy = sh.rows;
                    a.accumulate = mode >= 2;
                    const auto ref = run(a, false, y0, w_padded.get());
                    // one-shot blocks, then the resident grid for every matrix
                    // (each warp several tiles through two buffers), then the
                    // slice ring's forms (bulk_slices 2: every matrix)
                    for (int ring = 0; ring <= 4; ++ring) {
                        const Slices sl = ring >= 2 ? kSliceForms[ring - 2] : Slices{};
                        if (ring >= 2) {
                            ASSERT_GT(routed_bulk(a, sl).slots, 0) << "form " << ring << ": no slice ring";
                        }
                        const auto got = run(a, true, y0, nullptr, ring == 1 ? 1 : 0, sl);
                        GPU_OK(cudaGetLastError());
                        for (int r = 0; r < sh.rows; ++r) {
                            const float e = ref[size_t(r)], v = got[size_t(r)];
                            const std::string what = ehp::type_name(type) + " " + std::to_string(sh.rows) + "x" +
                                                     std::to_string(sh.cols) + " mode " + std::to_string(mode) +
                                                     " input " + std::to_string(int(in)) + " ring " +
                                                     std::to_string(ring) + " row " + std::to_string(r);
                            // The RMSNorm fold's 1/rms sums the block's partial
                            // sums of squares, and the blocks differ in warps:
                            // last bits of that factor only.
                            if (mode == 1) ASSERT_NEAR(e, v, 1e-5 * (1 + std::fabs(e))) << what;
                            else ASSERT_EQ(e, v) << what;
                        }
                        ++checked;
                    }
                }
            }
        }
    EXPECT_GT(checked, 500);
}

// The slice ring on rows a tile holds fewer than two of (Gemma 3 12B's
// ffn_down: 15,360 inputs, 15 slices a row; bulk_slices 1 takes the Q6_K
// ones, 2 the other types), against
// the one-shot kernel (the register kernel splits K for so few rows):
// bitwise, for a producer's chunks and staged inputs (the RMSNorm fold to
// the last bits of its 1 / rms), with slots refilled many times, a ragged
// last row group and the tensor's unaligned end.
TEST(GemvBulk, SliceRingTakesLongRowsBitwise) {
    REQUIRE_GPU();
    const int rows = 601, cols = 15360;
    const uint32_t types[] = {EH_TYPE_Q4_0, EH_TYPE_Q5_1, EH_TYPE_Q8_0, EH_TYPE_Q4_K, EH_TYPE_Q5_K,
                              EH_TYPE_Q6_K, EH_TYPE_Q3_K, EH_TYPE_IQ4_XS};
    int checked = 0;
    for (uint32_t type : types) {
        const size_t rb = ehcuda::row_bytes(type, cols);
        std::mt19937 rng(type * 11 + 3);
        auto w = exact_device(random_rows(type, rows, cols, rng));
        std::normal_distribution<float> nd;
        std::vector<float> x(static_cast<size_t>(cols)), nw(static_cast<size_t>(cols)), y0(static_cast<size_t>(rows));
        for (auto& v : x) v = 2 * nd(rng);
        for (auto& v : nw) v = 1 + 0.3f * nd(rng);
        for (auto& v : y0) v = nd(rng);
        auto dx = to_device(x), dn = to_device(nw);
        for (auto in : {ehcuda::GemvInput::Int16, ehcuda::GemvInput::Int16x2}) {
            InputGuard ig(in);
            auto dc = to_device(host_chunks(cols, in == ehcuda::GemvInput::Int16 ? 16 : 32, rng));
            for (int mode : {0, 1, 3}) {
                ehcuda::MatmulArgs a;
                a.seg[0].w = {w.get(), type, rows, cols, rb};
                a.cols = cols;
                a.x = mode == 3 ? static_cast<const float*>(dc.get()) : dx.as<float>();
                a.ldx = cols;
                a.xmode = mode == 0 ? ehcuda::XMode::Plain : mode == 1 ? ehcuda::XMode::RmsNorm : ehcuda::XMode::Chunks;
                a.norm_w = dn.as<float>();
                a.norm_eps = 1e-5f;
                a.ldy = rows;
                a.accumulate = mode == 3;
                const auto ref = run(a, true, y0);
                const int on = type == EH_TYPE_Q6_K ? 1 : 2;
                if (on == 2) ASSERT_EQ(routed_bulk(a, Slices{1, 2, 0, 0}).slots, 0) << ehp::type_name(type);
                for (const Slices sl : {Slices{on, 2, 0, 0}, Slices{on, 4, 2, 16}}) {
                    const std::string what = ehp::type_name(type) + " mode " + std::to_string(mode) + " input " +
                                             std::to_string(int(in)) + " slots " + std::to_string(sl.slots);
                    ASSERT_GT(routed_bulk(a, sl).slots, 0) << what << ": no slice ring";
                    ASSERT_EQ(routed_bulk(a, Slices{}).slots, 0) << what;
                    const auto got = run(a, true, y0, nullptr, 0, sl);
                    GPU_OK(cudaGetLastError());
                    for (int r = 0; r < rows; ++r) {
                        const float e = ref[size_t(r)], v = got[size_t(r)];
                        if (mode == 1) ASSERT_NEAR(e, v, 1e-5 * (1 + std::fabs(e))) << what << " row " << r;
                        else ASSERT_EQ(e, v) << what << " row " << r;
                    }
                    ++checked;
                }
            }
        }
    }
    EXPECT_EQ(checked, 8 * 2 * 3 * 2);
}

// A launch whose dynamic shared memory (49,136 bytes on a 132-SM device:
// 8 warps' 1-row Q8_0 tiles of 4,448 columns and the int16 input) is under
// 48 KB while with the kernel's static arrays it is over: it needs the
// opt-in (allow_dynamic_smem), or the launch fails with invalid argument.
// Checked against host math.
TEST(GemvBulk, SharedMemoryJustUnderTheDefaultLimit) {
    REQUIRE_GPU();
    const int rows = 1100, cols = 4448;
    InputGuard ig(ehcuda::GemvInput::Int16);
    BulkGuard bg(true);
    std::mt19937 rng(17);
    const auto host_w = random_rows(EH_TYPE_Q8_0, rows, cols, rng);
    auto w = to_device(host_w);
    std::normal_distribution<float> nd;
    std::vector<float> x(static_cast<size_t>(cols));
    for (auto& v : x) v = nd(rng);
    auto dx = to_device(x);
    ehcuda::DeviceBuffer dy(size_t(rows) * 4);
    ehcuda::MatmulArgs a;
    const size_t rb = row_size(EH_TYPE_Q8_0, cols);
    a.seg[0].w = {w.get(), EH_TYPE_Q8_0, rows, cols, rb};
    a.cols = cols;
    a.x = dx.as<float>();
    a.ldx = cols;
    a.y = dy.as<float>();
    a.ldy = rows;
    ASSERT_NO_THROW(ehcuda::matmul(a, nullptr));
    GPU_OK(cudaDeviceSynchronize());
    const auto got = to_host<float>(dy, size_t(rows));
    std::vector<float> row(static_cast<size_t>(cols));
    for (int r = 0; r < rows; ++r) {
        dequant_row(EH_TYPE_Q8_0, host_w.data() + size_t(r) * rb, cols, row.data());
        double want = 0, mag = 0;
        for (int k = 0; k < cols; ++k) {
            want += double(row[size_t(k)]) * x[size_t(k)];
            mag += std::fabs(double(row[size_t(k)]) * x[size_t(k)]);
        }
        ASSERT_NEAR(got[size_t(r)], want, 1e-4 * mag) << "row " << r;
    }
}

// Segments of one type and of mixed types (Qwen2.5's Q5_0 / Q8_0 QKV), rows
// not a multiple of the tile, each segment's tiles its own.
TEST(GemvBulk, SegmentsBitwiseEqual) {
    REQUIRE_GPU();
    const int cols = 896;
    for (bool mixed : {false, true}) {
        const uint32_t types[3] = {EH_TYPE_Q5_0, mixed ? EH_TYPE_Q8_0 : EH_TYPE_Q5_0, EH_TYPE_Q8_0};
        const int rows[3] = {901, 131, 131};
        std::mt19937 rng(mixed ? 5 : 6);
        std::vector<ehcuda::DeviceBuffer> bufs;
        ehcuda::MatmulArgs a;
        int off = 0;
        for (int s = 0; s < 3; ++s) {
            bufs.push_back(to_device(random_rows(types[s], rows[s], cols, rng)));
            a.seg[s].w = {bufs.back().get(), types[s], rows[s], cols, row_size(types[s], cols)};
            a.seg[s].out_offset = off;  // a gap after each segment stays untouched
            off += rows[s] + 1;
        }
        a.nseg = mixed ? 3 : 2;
        std::vector<float> x(static_cast<size_t>(cols)), y0(static_cast<size_t>(off));
        std::normal_distribution<float> nd;
        for (auto& v : x) v = 4 * nd(rng);
        for (auto& v : y0) v = nd(rng);
        auto dx = to_device(x);
        a.cols = cols;
        a.x = dx.as<float>();
        a.ldx = cols;
        a.ldy = off;
        for (auto in : {ehcuda::GemvInput::Int16, ehcuda::GemvInput::Int16x2}) {
            InputGuard ig(in);
            const auto ref = run(a, false, y0);
            // one-shot, resident grid, the slice ring's forms
            for (int ring = 0; ring <= 4; ++ring) {
                const Slices sl = ring >= 2 ? kSliceForms[ring - 2] : Slices{};
                if (ring >= 2) {
                    ASSERT_GT(routed_bulk(a, sl).slots, 0) << "mixed " << mixed << " form " << ring;
                }
                const auto got = run(a, true, y0, nullptr, ring == 1 ? 1 : 0, sl);
                GPU_OK(cudaGetLastError());
                for (int r = 0; r < off; ++r)
                    ASSERT_EQ(ref[size_t(r)], got[size_t(r)]) << "mixed " << mixed << " ring " << ring << " row " << r;
            }
        }
    }
}

// The bulk kernels' token groups (2 .. 8 tokens, each weight read once for
// the group) against the same tokens run one at a time through the
// single-token bulk kernel: the same codes, the sums in another fixed order
// (so equal within float reassociation), and bitwise the same whether the
// blocks are one-shot or resident and whether each block quantizes the
// inputs or copies them quantized once into the workspace's scratch. Every
// integer-path type, both input forms, plain and SwiGLU inputs with their
// row strides, bias and accumulation, groups of every width, a matrix too
// wide for one group of 8 (split into narrower groups), and mixed-type
// segments in one launch. Each case also with each weight chunk decoded
// once for the group (bulk_group_once: lanes take chunks, not tokens; tiles
// of at most 4 rows): the same agreement, and bitwise the same over its
// three forms.
TEST(GemvBulk, TokenGroupsAgreeWithOneTokenAtATime) {
    REQUIRE_GPU();
    BulkGuard bg(true);
    const ehcuda::KernelPlan plan_was = test_plan();
    set_bulk_max_tokens(ehcuda::kBulkMaxTokens);
    set_bulk_group_stage_cols(0);  // (form 2: every shape's inputs quantized once)
    const Shape shapes[] = {{37, 96}, {4100, 640}, {896, 4864}, {512, 14336}};
    ehcuda::PrefillShape ps;
    ps.max_tokens = 16;
    ps.max_cols = 14336;
    ehcuda::PrefillWorkspace ws(ps, nullptr, nullptr);
    ws.set_min_tokens(0);  // the scratch only: no cuBLAS
    const uint32_t types[] = {EH_TYPE_Q4_0, EH_TYPE_Q4_1, EH_TYPE_Q5_0, EH_TYPE_Q5_1,
                              EH_TYPE_Q8_0, EH_TYPE_Q4_K, EH_TYPE_Q5_K, EH_TYPE_Q6_K,
                              EH_TYPE_Q2_K, EH_TYPE_Q3_K, EH_TYPE_IQ4_NL, EH_TYPE_IQ4_XS};
    int checked = 0;
    for (const Shape& sh : shapes)
        for (uint32_t type : types) {
            const size_t rb = ehcuda::row_bytes(type, sh.cols);
            if (rb == 0) continue;
            std::mt19937 rng(type * 13 + uint32_t(sh.cols));
            auto w = exact_device(random_rows(type, sh.rows, sh.cols, rng));
            std::normal_distribution<float> nd;
            const int kTok = ehcuda::kBulkMaxTokens;
            std::vector<float> x(size_t(kTok) * 2 * sh.cols), bias(size_t(sh.rows)), y0(size_t(kTok) * sh.rows);
            for (auto& v : x) v = 2 * nd(rng);
            for (auto& v : bias) v = nd(rng);
            for (auto& v : y0) v = nd(rng);
            auto dx = to_device(x), db = to_device(bias);
            for (auto in : {ehcuda::GemvInput::Int16, ehcuda::GemvInput::Int16x2})
                for (int mode = 0; mode < 2; ++mode)
                    for (int n : {2, 3, 5, 8}) {
                        InputGuard ig(in);
                        ehcuda::MatmulArgs a;
                        a.seg[0].w = {w.get(), type, sh.rows, sh.cols, rb};
                        a.seg[0].bias = mode == 0 ? db.as<float>() : nullptr;
                        a.cols = sh.cols;
                        a.x = dx.as<float>();
                        a.ldx = mode == 1 ? 2 * sh.cols : sh.cols + 32;  // strides past the row
                        a.xmode = mode == 1 ? ehcuda::XMode::SwiGLU : ehcuda::XMode::Plain;
                        a.ldy = sh.rows;
                        a.accumulate = mode == 1;
                        a.ntok = n;
                        const std::string what = ehp::type_name(type) + " " + std::to_string(sh.rows) + "x" +
                                                 std::to_string(sh.cols) + " input " + std::to_string(int(in)) +
                                                 " mode " + std::to_string(mode) + " tokens " + std::to_string(n);
                        ASSERT_TRUE(ehcuda::matmul_groups_tokens(a)) << what;
                        std::vector<float> ref;
                        for (int t = 0; t < n; ++t) {
                            ehcuda::MatmulArgs one = a;
                            one.ntok = 1;
                            one.x = a.x + size_t(t) * a.ldx;
                            const auto r1 = run(one, true, std::vector<float>(y0.begin() + size_t(t) * sh.rows,
                                                                              y0.begin() + size_t(t + 1) * sh.rows));
                            ref.insert(ref.end(), r1.begin(), r1.end());
                        }
                        // 0 / 1: one-shot blocks / the resident grid, each block
                        // quantizing the float rows; 2: the inputs quantized once
                        // into the workspace's scratch (as a batched step runs
                        // them); 3 .. 5: the same, each weight chunk decoded once;
                        // 6: 5 with rows too long for two in a tile in slices of
                        // K (bulk_group_kslice: the 14336-input shape), its
                        // second run the same bits
                        std::vector<float> first;
                        for (int form = 0; form <= 7; ++form) {
                            ehcuda::MatmulArgs g = a;
                            if (form % 3 == 2 || form >= 6) g.prefill = &ws;
                            set_bulk_group_once(form >= 3);
                            set_bulk_group_kslice(form >= 6);
                            if (form == 6 && sh.cols == 14336 && in == ehcuda::GemvInput::Int16) {
                                ehcuda::MatmulShape m;
                                m.g.type[0] = type;
                                m.g.rows[0] = sh.rows;
                                m.g.row_bytes[0] = rb;
                                m.g.cols = sh.cols;
                                m.ntok = n;
                                m.token_scratch = ws.act_halves() * 2;
                                m.aligned = true;
                                int sms = 0;
                                GPU_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
                                const auto r = ehcuda::route_matmul(ehcuda::plan(), ehcuda::DeviceTraits{9, 0, sms}, m);
                                ASSERT_EQ(r.n, 1) << what;
                                ASSERT_GT(r.launch[0].bulk.kslice, 0) << what << ": not sliced";
                            }
                            const auto got = run(g, true, y0, nullptr, form % 3 == 1 && form < 6 ? 1 : 0);
                            GPU_OK(cudaGetLastError());
                            // float reassociation of a row's chunk sums: within a
                            // small part of the outputs' typical size
                            double typical = 0;
                            for (float v : ref) typical += std::fabs(v) / double(ref.size());
                            for (size_t i = 0; i < size_t(n) * sh.rows; ++i)
                                ASSERT_NEAR(ref[i], got[i], 1e-4 * (std::fabs(ref[i]) + typical))
                                    << what << " form " << form << " token " << i / sh.rows << " row " << i % sh.rows;
                            if (form % 3 == 0) first = got;  // (6: its own first)
                            else
                                for (size_t i = 0; i < size_t(n) * sh.rows; ++i)
                                    ASSERT_EQ(first[i], got[i]) << what << " form " << form << " element " << i;
                            ++checked;
                        }
                    }
        }
    // Mixed Q5_0 / Q8_0 segments (Qwen2.5's QKV), 4 tokens in one launch,
    // the weights decoded per token and once.
    for (bool once : {false, true}) {
        set_bulk_group_once(once);
        const int cols = 896;
        const uint32_t seg_types[3] = {EH_TYPE_Q5_0, EH_TYPE_Q5_0, EH_TYPE_Q8_0};
        const int rows[3] = {901, 131, 131};
        std::mt19937 rng(9);
        std::vector<ehcuda::DeviceBuffer> bufs;
        ehcuda::MatmulArgs a;
        int off = 0;
        for (int s = 0; s < 3; ++s) {
            bufs.push_back(to_device(random_rows(seg_types[s], rows[s], cols, rng)));
            a.seg[s].w = {bufs.back().get(), seg_types[s], rows[s], cols, row_size(seg_types[s], cols)};
            a.seg[s].out_offset = off;
            off += rows[s] + 1;
        }
        a.nseg = 3;
        std::vector<float> x(size_t(4) * cols), y0(size_t(4) * off);
        std::normal_distribution<float> nd;
        for (auto& v : x) v = 4 * nd(rng);
        for (auto& v : y0) v = nd(rng);
        auto dx = to_device(x);
        a.cols = cols;
        a.x = dx.as<float>();
        a.ldx = cols;
        a.ldy = off;
        a.ntok = 4;
        ASSERT_TRUE(ehcuda::matmul_groups_tokens(a));
        const auto got = run(a, true, y0);
        for (int t = 0; t < 4; ++t) {
            ehcuda::MatmulArgs one = a;
            one.ntok = 1;
            one.x = a.x + size_t(t) * cols;
            const auto ref = run(one, true, std::vector<float>(y0.begin() + size_t(t) * off, y0.begin() + size_t(t + 1) * off));
            for (int r = 0; r < off; ++r)
                ASSERT_NEAR(ref[size_t(r)], got[size_t(t) * off + size_t(r)], 1e-4 * (1 + std::fabs(ref[size_t(r)])))
                    << "mixed token " << t << " row " << r << " once " << once;
        }
        ++checked;
    }
    test_plan() = plan_was;
    EXPECT_GT(checked, 1200);
}

// Token groups with an RMSNorm (bulk_group_norm: the norm taken where the
// inputs are quantized, once into the workspace's scratch or by each
// block, each token's 1 / rms applied to its sums) against each token
// alone through the single-token fold: the same codes, the sums of squares
// in another fixed order (equal within float rounding); the same bits from
// one-shot blocks and the resident grid; with the weights decoded per token
// and once; and the norm really applied (rows of very different scales).
TEST(GemvBulk, TokenGroupsTakeTheRmsNorm) {
    REQUIRE_GPU();
    BulkGuard bg(true);
    const ehcuda::KernelPlan plan_was = test_plan();
    set_bulk_max_tokens(ehcuda::kBulkMaxTokens);
    set_bulk_group_norm(true);
    set_bulk_group_stage_cols(0);
    set_bulk_group_kslice(false);
    ehcuda::PrefillShape ps;
    ps.max_tokens = 16;
    ps.max_cols = 4096;
    ehcuda::PrefillWorkspace ws(ps, nullptr, nullptr);
    ws.set_min_tokens(0);
    const Shape shapes[] = {{896, 896}, {1000, 4096}};
    const uint32_t types[] = {EH_TYPE_Q5_0, EH_TYPE_Q8_0, EH_TYPE_Q4_K, EH_TYPE_Q6_K, EH_TYPE_Q2_K, EH_TYPE_IQ4_XS};
    int checked = 0;
    for (const Shape& sh : shapes)
        for (uint32_t type : types) {
            const size_t rb = ehcuda::row_bytes(type, sh.cols);
            if (rb == 0) continue;
            std::mt19937 rng(type * 7 + uint32_t(sh.cols));
            auto w = exact_device(random_rows(type, sh.rows, sh.cols, rng));
            std::normal_distribution<float> nd;
            const int kTok = ehcuda::kBulkMaxTokens;
            std::vector<float> x(size_t(kTok) * sh.cols), nw(size_t(sh.cols)), y0(size_t(kTok) * sh.rows);
            for (int t = 0; t < kTok; ++t)
                for (int i = 0; i < sh.cols; ++i) x[size_t(t) * sh.cols + i] = float(1 << (2 * t)) * nd(rng);
            for (auto& v : nw) v = 1.0f + 0.5f * nd(rng);
            auto dx = to_device(x), dn = to_device(nw);
            for (auto in : {ehcuda::GemvInput::Int16, ehcuda::GemvInput::Int16x2})
                for (int n : {2, 5, 8}) {
                    InputGuard ig(in);
                    ehcuda::MatmulArgs a;
                    a.seg[0].w = {w.get(), type, sh.rows, sh.cols, rb};
                    a.cols = sh.cols;
                    a.x = dx.as<float>();
                    a.ldx = sh.cols;
                    a.xmode = ehcuda::XMode::RmsNorm;
                    a.norm_w = dn.as<float>();
                    a.norm_eps = 1e-6f;
                    a.ldy = sh.rows;
                    a.ntok = n;
                    const std::string what = ehp::type_name(type) + " " + std::to_string(sh.rows) + "x" +
                                             std::to_string(sh.cols) + " input " + std::to_string(int(in)) +
                                             " tokens " + std::to_string(n);
                    ASSERT_TRUE(ehcuda::matmul_groups_tokens(a)) << what;
                    std::vector<float> ref;
                    for (int t = 0; t < n; ++t) {
                        ehcuda::MatmulArgs one = a;
                        one.ntok = 1;
                        one.prefill = nullptr;
                        one.x = a.x + size_t(t) * a.ldx;
                        const auto r1 = run(one, true, std::vector<float>(size_t(sh.rows), 0.0f));
                        ref.insert(ref.end(), r1.begin(), r1.end());
                    }
                    // the tokens' outputs are of one size whatever their inputs' scale
                    double s0 = 0, sl = 0;
                    for (int r = 0; r < sh.rows; ++r) {
                        s0 += std::fabs(ref[size_t(r)]);
                        sl += std::fabs(ref[size_t(n - 1) * sh.rows + r]);
                    }
                    ASSERT_LT(std::fabs(sl / s0 - 1.0), 0.5) << what;
                    for (int form = 0; form < 4; ++form) {
                        const bool once = form & 1, scratch = form & 2;
                        ehcuda::MatmulArgs g = a;
                        g.prefill = scratch ? &ws : nullptr;
                        set_bulk_group_once(once);
                        const auto got = run(g, true, y0);
                        const auto again = run(g, true, y0, nullptr, 1);  // the resident grid
                        GPU_OK(cudaGetLastError());
                        for (size_t i = 0; i < size_t(n) * sh.rows; ++i) {
                            ASSERT_NEAR(ref[i], got[i], 1e-4 * (std::fabs(ref[i]) + s0 / sh.rows))
                                << what << " form " << form << " token " << i / sh.rows << " row " << i % sh.rows;
                            ASSERT_EQ(got[i], again[i]) << what << " form " << form << " element " << i;
                        }
                        ++checked;
                    }
                }
        }
    test_plan() = plan_was;
    EXPECT_GE(checked, 120);
}

}  // namespace
}  // namespace ehtest
