#include "eh/sha256.hpp"

#include <openssl/evp.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "eh/error.hpp"

namespace eh {

std::string sha256_file_hex(const std::string& path) {
    std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
    if (!f) throw Error(Code::NotFound, "cannot open '" + path + "' to hash it");
    std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
    if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
        throw Error(Code::Internal, "SHA-256 initialisation failed");
    std::vector<unsigned char> buf(1 << 20);
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0)
        EVP_DigestUpdate(ctx.get(), buf.data(), n);
    if (std::ferror(f.get())) throw Error(Code::NotFound, "read error while hashing '" + path + "'");
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int md_len = 0;
    EVP_DigestFinal_ex(ctx.get(), md, &md_len);
    static const char* hex = "0123456789abcdef";
    std::string out;
    for (unsigned i = 0; i < md_len; ++i) {
        out.push_back(hex[md[i] >> 4]);
        out.push_back(hex[md[i] & 15]);
    }
    return out;
}

}  // namespace eh
