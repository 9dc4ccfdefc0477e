// Constants of the decode attention kernels of attention_decode.cu (fused)
// and attention_decode_split.cu (decode + merge), which share the scratch
// layout and the split sizes.
#pragma once

namespace ehcuda::detail {

constexpr int kDecodeWarps = 4;
constexpr int kMinChunk = 64;
// Keys a warp scores per iteration. The loop is latency-bound (each key is a
// dependent load → reduce → rescale chain), so loading several keys' K and V
// rows before reducing any of them keeps that many loads in flight.
constexpr int kKeysPerIter = 4;
// attention_decode_splits' cap; the fused kernel stages one float pair per
// split in shared memory.
constexpr int kMaxDecodeSplits = 128;

}  // namespace ehcuda::detail
