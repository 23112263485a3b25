#pragma once
// Loops split across threads, for the engine's own CPU kernels (the fused
// AdamW update, the gradient norm's sum of squares).
//
// Why not at::parallel_for: it is inline, and with LibTorch's OpenMP backend
// it runs in parallel only in a translation unit compiled with -fopenmp. Ours
// share LibTorch's precompiled header and are not, so it ran every loop on
// one thread (found by fsdp-bench-adamw: FusedAdamW took 0.140 s a step on
// 100 M elements with 2 threads, ATen's own fused AdamW 0.067 s). This file's
// .cpp is the one built with -fopenmp; it uses the OpenMP runtime LibTorch
// itself loads (one libgomp.so.1 in the process).

#include <cstdint>
#include <functional>

namespace fsdp::parallel {

// Calls fn(chunk_begin, chunk_end) for contiguous chunks that cover
// [begin, end): at most `threads` chunks, none of fewer than `grain`
// elements but the last, run on OpenMP threads (pass at::get_num_threads(),
// LibTorch's setting). An exception from fn is rethrown here (the first).
void for_each_chunk(int64_t begin, int64_t end, int64_t grain, int threads,
                    const std::function<void(int64_t, int64_t)>& fn);

}  // namespace fsdp::parallel
