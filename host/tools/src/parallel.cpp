#include "eh/tools/parallel.hpp"

#include <algorithm>

namespace eh::tools {

WorkerPool::WorkerPool(unsigned threads) {
    if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
    for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this] { loop(); });
}

WorkerPool::~WorkerPool() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_start_.notify_all();
    for (auto& t : workers_) t.join();
}

// Takes tasks until the batch is exhausted. Called with mu_ unlocked.
void WorkerPool::work_on_batch() {
    for (;;) {
        size_t i;
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (next_ >= n_) return;
            i = next_++;
        }
        try {
            (*fn_)(i);
        } catch (...) {
            std::lock_guard<std::mutex> lock(mu_);
            if (!error_) error_ = std::current_exception();
        }
        std::lock_guard<std::mutex> lock(mu_);
        if (++done_ == n_) cv_done_.notify_all();
    }
}

void WorkerPool::loop() {
    unsigned seen = 0;
    for (;;) {
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_start_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
            ++busy_;
        }
        work_on_batch();
        std::lock_guard<std::mutex> lock(mu_);
        if (--busy_ == 0) cv_done_.notify_all();
    }
}

void WorkerPool::run(size_t n, const std::function<void(size_t)>& fn) {
    if (n == 0) return;
    {
        std::lock_guard<std::mutex> lock(mu_);
        fn_ = &fn;
        n_ = n;
        next_ = 0;
        done_ = 0;
        error_ = nullptr;
        ++generation_;
    }
    cv_start_.notify_all();
    work_on_batch();
    std::exception_ptr err;
    {
        // wait for every task and for every worker to leave the batch, so
        // the next batch never races with a straggler reading fn_
        std::unique_lock<std::mutex> lock(mu_);
        cv_done_.wait(lock, [&] { return done_ == n_ && busy_ == 0; });
        err = error_;
        fn_ = nullptr;
    }
    if (err) std::rethrow_exception(err);
}

}  // namespace eh::tools
