// eh-tokenizer-bench: encode throughput (MB/s, one thread) over about 1 MB of
// mixed text (English prose, code, CJK, Cyrillic, Arabic, emoji, digits).
// Not a test: it only prints numbers.
//   eh-tokenizer-bench <tokenizer.json | dir> ...      (hf-json)
//   eh-tokenizer-bench --gguf <vocab.gguf> ...          (needs the GGUF reader)
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "eh/tokenizer/tokenizer.hpp"

#if __has_include("eh/model/model_file.hpp")
#include "eh/model/model_file.hpp"
#define EH_BENCH_HAVE_GGUF 1
#endif

namespace {

std::string make_corpus(size_t target) {
    const char* parts[] = {
        "The quick brown fox jumps over the lazy dog. It's 2024, and we've seen 1,234,567 tokens! ",
        "def encode(self, text: str) -> list[int]:\n    return [self.vocab[t] for t in text.split()]\n\n",
        "    for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // dot product\n",
        "我想在apple工作，今天天气很好。東京は日本の首都です。한국어도 조금 합니다. ",
        "Привет, мир! Это проверка токенизатора на кириллице. ",
        "مرحبا بالعالم، هذا اختبار. ",
        "Emoji: 🦙🚀😶‍🌫️✅ 👍🏽 and flags 🇫🇷. ",
        "\t\tindented\n\n\n   spaces   and\ttabs\r\n",
        "Cửa Việt — naïve café résumé Ångström. ",
    };
    std::string s;
    size_t k = 0;
    while (s.size() < target) {
        s += parts[k % std::size(parts)];
        s += std::to_string(k * 7919 % 100000);
        s += ' ';
        ++k;
    }
    return s;
}

void bench(const char* label, const eh::tokenizer::Tokenizer& tok, const std::string& text) {
    // Cold run (fills the word cache), then the timed warm runs. The corpus
    // repeats its sentences, so the warm figure is a cache-friendly best case.
    const auto c0 = std::chrono::steady_clock::now();
    size_t n_tokens = tok.encode(text, false, false).size();
    const double cold = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
    const int reps = 5;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) n_tokens = tok.encode(text, false, false).size();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    const auto t1 = std::chrono::steady_clock::now();
    std::vector<int32_t> ids = tok.encode(text, false, false);
    std::string back = tok.decode(ids);
    const double d = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    std::printf("%-9s %-48s cold %7.2f MB/s  warm %7.2f MB/s  %zu tokens  (encode+decode %.3f s, roundtrip %s)\n",
                std::string(tok.kind()).c_str(), label, text.size() / cold / 1e6, text.size() / s / 1e6, n_tokens, d,
                back == text ? "ok" : "DIFFERS");
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s [--gguf] <tokenizer.json|dir|vocab.gguf> ...\n", argv[0]);
        return 2;
    }
    const std::string text = make_corpus(1 << 20);
    bool gguf = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--gguf") { gguf = true; continue; }
        try {
            if (gguf) {
#ifdef EH_BENCH_HAVE_GGUF
                auto file = eh::model::ModelFile::open(a);
                auto tok = eh::tokenizer::Tokenizer::from_view(file->view());
                bench(a.c_str(), *tok, text);
#else
                std::fprintf(stderr, "%s: built without the GGUF reader\n", a.c_str());
#endif
            } else {
                auto tok = eh::tokenizer::Tokenizer::from_hf_json(a);
                bench(a.c_str(), *tok, text);
            }
        } catch (const std::exception& e) {
            std::fprintf(stderr, "%s: %s\n", a.c_str(), e.what());
        }
        gguf = false;
    }
    return 0;
}
