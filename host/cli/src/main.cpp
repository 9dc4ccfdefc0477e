// engine-host: serve a model over HTTP through a dynamically loaded engine
// plugin. `engine-host --help` lists the subcommands.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "cli.hpp"

namespace eh::cli {

int exit_code_for(Code code) {
    switch (code) {
    case Code::InvalidRequest: return kUsage;
    case Code::NoPlugin: case Code::PluginRejected: return kNoPlugin;
    case Code::ModelLoadFailed: case Code::NotFound: return kModelInvalid;
    case Code::InsufficientVram: return kInsufficientVram;
    default: return kFailure;
    }
}

void print_error(const std::string& message) {
    std::fprintf(stderr, "error: %s\n", message.c_str());
}

}  // namespace eh::cli

namespace {

const char* kUsageText = R"(engine-host — serve language models through engine plugins

Usage:
  engine-host [serve] --model REF [options]                  run the server
  engine-host chat --model REF [-p PROMPT]                   chat with a model in the terminal
  engine-host pull REF                                       download a model into the hub cache
  engine-host plugins [--plugins DIR] [--json]               list accepted and rejected plugins
  engine-host inspect --model REF [--plugins DIR] [--json]   describe a model file, its plugin, and whether serve takes it
  engine-host forge --like PROFILE --out FILE [--seed N]     write a real-shape GGUF with random weights
  engine-host quantize --in F --out G --type T               convert a GGUF's weights (Q8_0, Q4_K_M, MXFP4, ...)
  engine-host convert --hf DIR --out FILE [--type T]         Hugging Face safetensors directory to GGUF
  engine-host bench --model REF [--json]                     prefill/decode speed of each plugin serving a model
  engine-host loadgen [--url URL] [--levels 1,4,16,64]       tokens/s and latency of a running server under concurrent clients
  engine-host help | --help | -h                             this text
  engine-host version | --version                            print the version

REF: a GGUF file or Hugging Face model directory, hf://ORG/REPO/FILE, or
ORG/REPO[:QUANT] (fetched into the Hugging Face hub cache; HF_ENDPOINT,
HF_TOKEN, HF_HOME, HF_HUB_CACHE and HF_HUB_OFFLINE are honoured).
Plugins: --plugins DIR (repeatable), else beside the executable, the install
prefix's lib/engine-host/plugins, then $ENGINE_HOST_PLUGINS.

Run `engine-host <command> --help` for a command's options.

Exit codes:
  0  success
  1  failure not listed below
  2  bad command line
  3  plugin directory unusable, or no plugin can serve the model (also: a GPU
     plugin serves it but was rejected, or a GPU named with --gpu-device/--gpu
     is one no GPU plugin accepts; --device cpu runs it on the CPU)
  4  model file (or its tokenizer) unreadable or malformed (MODEL_LOAD_FAILED)
  5  the model does not fit in device memory (INSUFFICIENT_VRAM)
  130, 143  bench stopped by SIGINT, SIGTERM (no results)
)";

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::string> args(argv + 1, argv + argc);
    std::string cmd = args.empty() ? "" : args.front();
    try {
        if (cmd == "help" || cmd == "--help" || cmd == "-h") {
            std::fputs(kUsageText, stdout);
            return eh::cli::kOk;
        }
        if (cmd == "version" || cmd == "--version") {
            std::printf("engine-host %s (plugin ABI %d.%d)\n", EH_VERSION, EH_ABI_MAJOR, EH_ABI_MINOR);
            return eh::cli::kOk;
        }
        if (cmd == "plugins") return eh::cli::cmd_plugins({args.begin() + 1, args.end()});
        if (cmd == "inspect") return eh::cli::cmd_inspect({args.begin() + 1, args.end()});
        if (cmd == "serve") return eh::cli::cmd_serve({args.begin() + 1, args.end()});
        if (cmd == "forge") return eh::cli::cmd_forge({args.begin() + 1, args.end()});
        if (cmd == "quantize") return eh::cli::cmd_quantize({args.begin() + 1, args.end()});
        if (cmd == "convert") return eh::cli::cmd_convert({args.begin() + 1, args.end()});
        if (cmd == "bench") return eh::cli::cmd_bench({args.begin() + 1, args.end()});
        if (cmd == "loadgen") return eh::cli::cmd_loadgen({args.begin() + 1, args.end()});
        if (cmd == "pull") return eh::cli::cmd_pull({args.begin() + 1, args.end()});
        if (cmd == "chat") return eh::cli::cmd_chat({args.begin() + 1, args.end()});
        if (cmd == "engine-worker") return eh::cli::cmd_engine_worker({args.begin() + 1, args.end()});
        if (cmd.empty() || cmd.rfind("-", 0) == 0) return eh::cli::cmd_serve(args);
        eh::cli::print_error("unknown command '" + cmd + "' (try `engine-host --help`)");
        return eh::cli::kUsage;
    } catch (const eh::Error& e) {
        eh::cli::print_error(std::string(e.what()) + " [" + eh::code_name(e.code()) + "]");
        return eh::cli::exit_code_for(e.code());
    } catch (const std::exception& e) {
        eh::cli::print_error(std::string("internal error: ") + e.what());
        return eh::cli::kFailure;
    }
}
