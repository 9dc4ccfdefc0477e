// A small fixed pool for data-parallel loops. The calling thread takes part,
// so a pool of N threads starts N-1 workers. One loop runs at a time; callers
// from several threads (several sessions) take turns.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace cpuref {

class ThreadPool {
public:
    explicit ThreadPool(unsigned n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    unsigned size() const { return n_threads_; }

    // Calls fn(begin, end) over [0, n) split into at most size() contiguous
    // ranges, and returns when all are done. `min_per_thread` keeps small
    // loops on fewer threads, where waking workers costs more than it saves.
    // An exception thrown by fn on any thread is rethrown here.
    void parallel_for(size_t n, size_t min_per_thread,
                      const std::function<void(size_t, size_t)>& fn);

private:
    void worker(unsigned index);

    unsigned n_threads_;
    std::vector<std::thread> workers_;
    std::mutex run_mutex_;  // one loop at a time

    std::mutex m_;
    std::condition_variable start_cv_, done_cv_;
    const std::function<void(size_t, size_t)>* job_ = nullptr;
    size_t job_n_ = 0;
    unsigned job_parts_ = 0;
    unsigned pending_ = 0;
    unsigned long long generation_ = 0;
    bool stop_ = false;
    std::exception_ptr error_;  // first exception a worker threw this loop
};

}  // namespace cpuref
