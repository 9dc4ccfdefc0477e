#include "thread_pool.hpp"

namespace cpuref {

ThreadPool::ThreadPool(unsigned n_threads) : n_threads_(n_threads ? n_threads : 1) {
    for (unsigned i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lk(m_);
        stop_ = true;
    }
    start_cv_.notify_all();
    for (auto& t : workers_) t.join();
}

static void part_range(size_t n, unsigned parts, unsigned index, size_t& begin, size_t& end) {
    begin = n * index / parts;
    end = n * (index + 1) / parts;
}

void ThreadPool::parallel_for(size_t n, size_t min_per_thread,
                              const std::function<void(size_t, size_t)>& fn) {
    if (n == 0) return;
    if (min_per_thread == 0) min_per_thread = 1;
    size_t want = n / min_per_thread;
    unsigned parts = static_cast<unsigned>(want < n_threads_ ? (want ? want : 1) : n_threads_);
    if (parts <= 1) {
        fn(0, n);
        return;
    }
    std::lock_guard<std::mutex> run(run_mutex_);
    {
        std::lock_guard<std::mutex> lk(m_);
        job_ = &fn;
        job_n_ = n;
        job_parts_ = parts;
        pending_ = parts - 1;
        ++generation_;
    }
    start_cv_.notify_all();
    size_t b, e;
    part_range(n, parts, 0, b, e);
    std::exception_ptr err;
    try {
        fn(b, e);
    } catch (...) {
        err = std::current_exception();
    }
    std::unique_lock<std::mutex> lk(m_);
    done_cv_.wait(lk, [this] { return pending_ == 0; });
    job_ = nullptr;
    if (!err) err = error_;
    error_ = nullptr;
    lk.unlock();
    if (err) std::rethrow_exception(err);
}

void ThreadPool::worker(unsigned index) {
    unsigned long long seen = 0;
    for (;;) {
        const std::function<void(size_t, size_t)>* job;
        size_t n;
        unsigned parts;
        {
            std::unique_lock<std::mutex> lk(m_);
            start_cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
            job = job_;
            n = job_n_;
            parts = job_parts_;
        }
        if (index < parts) {
            size_t b, e;
            part_range(n, parts, index, b, e);
            std::exception_ptr err;
            try {
                (*job)(b, e);
            } catch (...) {
                err = std::current_exception();
            }
            std::lock_guard<std::mutex> lk(m_);
            if (err && !error_) error_ = err;
            if (--pending_ == 0) done_cv_.notify_one();
        }
    }
}

}  // namespace cpuref
