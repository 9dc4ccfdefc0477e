// The SHA-256 of a file, computed once on a background thread (a model file
// of tens of GB takes seconds; nothing waits for it): the artifact records'
// model digest. get() is empty until it is done, or when the file could not
// be read (then error() says why).
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <thread>

namespace eh::http {

class FileDigest {
public:
    explicit FileDigest(std::string path);
    ~FileDigest();  // stops a hash in progress
    FileDigest(const FileDigest&) = delete;
    FileDigest& operator=(const FileDigest&) = delete;

    std::string get() const;  // lowercase hex, or "" while pending / on error
    std::string error() const;

private:
    void run();
    std::string path_;
    mutable std::mutex mu_;
    std::string hex_, error_;
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

}  // namespace eh::http
