// A fixed set of worker threads that runs batches of independent tasks.
// The forge and the quantizer use it to spread block quantization over
// every core while the writer streams finished bytes in order.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace eh::tools {

class WorkerPool {
public:
    explicit WorkerPool(unsigned threads = 0);  // 0 = hardware concurrency
    ~WorkerPool();
    WorkerPool(const WorkerPool&) = delete;
    WorkerPool& operator=(const WorkerPool&) = delete;

    unsigned size() const { return static_cast<unsigned>(workers_.size()) + 1; }
    // Runs fn(i) for i in [0, n) on all threads (the caller's included) and
    // returns when every task is done. The first exception a task throws is
    // rethrown here after the batch finishes.
    void run(size_t n, const std::function<void(size_t)>& fn);

private:
    void work_on_batch();
    void loop();
    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::condition_variable cv_start_, cv_done_;
    const std::function<void(size_t)>* fn_ = nullptr;
    size_t n_ = 0, next_ = 0, done_ = 0;
    unsigned generation_ = 0;
    unsigned busy_ = 0;
    bool stop_ = false;
    std::exception_ptr error_;
};

}  // namespace eh::tools
