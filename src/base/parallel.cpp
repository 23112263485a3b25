// fsdp::parallel::for_each_chunk on OpenMP (this file alone is built with
// -fopenmp, and includes no LibTorch header: see parallel.h).

#include "base/parallel.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <exception>

namespace fsdp::parallel {

void for_each_chunk(int64_t begin, int64_t end, int64_t grain, int threads,
                    const std::function<void(int64_t, int64_t)>& fn) {
  if (begin >= end) return;
  const int64_t n = end - begin;
  const int64_t by_grain = grain > 0 ? (n + grain - 1) / grain : n;
  const int chunks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(std::max(threads, 1), by_grain)));
  if (chunks == 1 || omp_in_parallel()) {
    fn(begin, end);
    return;
  }
  const int64_t chunk = (n + chunks - 1) / chunks;
  std::atomic_flag failed = ATOMIC_FLAG_INIT;
  std::exception_ptr error;
  // No num_threads clause (ATen avoids it too: a team size other than the
  // runtime's setting rebuilds GOMP's thread pool, pytorch#32008): the team
  // is LibTorch's, and its threads take the chunks in turn.
#pragma omp parallel
  {
    const int team = omp_get_num_threads(), self = omp_get_thread_num();
    for (int c = self; c < chunks; c += team) {
      const int64_t b = begin + c * chunk, e = std::min(end, b + chunk);
      if (b >= e) continue;
      try {
        fn(b, e);
      } catch (...) {
        if (!failed.test_and_set()) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace fsdp::parallel
