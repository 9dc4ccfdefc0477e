#include "file_digest.hpp"

#include <openssl/evp.h>

#include <cstdio>
#include <memory>
#include <vector>

namespace eh::http {

FileDigest::FileDigest(std::string path) : path_(std::move(path)) { thread_ = std::thread([this] { run(); }); }

FileDigest::~FileDigest() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
}

std::string FileDigest::get() const {
    std::lock_guard lock(mu_);
    return hex_;
}

std::string FileDigest::error() const {
    std::lock_guard lock(mu_);
    return error_;
}

void FileDigest::run() {
    auto fail = [&](const std::string& why) {
        std::lock_guard lock(mu_);
        error_ = why;
    };
    std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path_.c_str(), "rb"), &std::fclose);
    if (!f) return fail("cannot open " + path_);
    std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
    if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) return fail("sha256 unavailable");
    std::vector<unsigned char> buf(size_t(4) << 20);
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) {
        if (stop_) return fail("stopped");
        if (EVP_DigestUpdate(ctx.get(), buf.data(), n) != 1) return fail("sha256 failed");
    }
    if (std::ferror(f.get())) return fail("read error in " + path_);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (EVP_DigestFinal_ex(ctx.get(), md, &len) != 1) return fail("sha256 failed");
    static const char* kHex = "0123456789abcdef";
    std::string hex;
    for (unsigned i = 0; i < len; ++i) {
        hex += kHex[md[i] >> 4];
        hex += kHex[md[i] & 15];
    }
    std::lock_guard lock(mu_);
    hex_ = std::move(hex);
}

}  // namespace eh::http
