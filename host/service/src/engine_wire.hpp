// The engine process's wire protocol (serve --engine-process): the parent
// drives a SeqEngine that lives in a child over one stream socket.
//
// A frame is a 4-byte body length (host byte order: both ends are the same
// executable) then the body: a 1-byte message type and its fields, in the
// same byte order. Every length in a frame is checked against what is left
// of it and against the limits below before anything is allocated, so a
// short, long or lying frame is a ProtocolError, never an overread. The
// parent treats a ProtocolError as the engine's failure (it kills and
// restarts the child); the child exits on one.
//
// Child -> parent, once: Progress* then Ready (the protocol version, the
// model's facts) or LoadFailed (code, message). Then strictly one request,
// one reply: the reply is the request's own type, or Error (code, message).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "eh/error.hpp"
#include "eh/service/engine_source.hpp"
#include "eh/service/seq_engine.hpp"

namespace eh::service::wire {

inline constexpr uint16_t kVersion = 6;  // 3: the KV cache type in KvInit and the limits; 4: draft verification; 5: SetAdapter; 6: the host tier
inline constexpr uint32_t kMagic = 0x50454845;            // "EHEP"
inline constexpr uint32_t kMaxFrame = 256u << 20;          // bytes of one body
inline constexpr uint32_t kMaxString = 64u << 10;          // bytes of one string
inline constexpr uint32_t kMaxEntries = 65536;             // entries of one step (the host's --parallel is at most 4096)
inline constexpr uint32_t kMaxVocab = 1u << 24;            // logits of one entry; mask words are kMaxVocab / 32

enum class Msg : uint8_t {
    // requests (parent -> child), each answered by the same type or Error
    KvInit = 1,
    Create = 2,
    Fork = 3,
    Truncate = 4,
    Release = 5,
    SetSampling = 6,
    Step = 7,
    Residency = 8,
    Ping = 9,           // no fields; answered by the engine process itself, never the plugin
    SetAdapter = 10,    // seq, n = the LoRA adapter (1-based; 0 none), as SeqEngine::set_adapter
    // The prefix cache's host tier (SeqEngine::park / unpark / drop_parked)
    Park = 11,          // seq, n, max_bytes
    Unpark = 12,        // parked, tokens; the reply's seq is 0 when the KV blocks do not suffice
    DropParked = 13,    // parked
    // child -> parent
    Progress = 64,
    Ready = 65,
    LoadFailed = 66,
    Error = 67,
};

class ProtocolError : public eh::Error {
public:
    explicit ProtocolError(const std::string& what) : eh::Error(Code::Internal, "engine protocol: " + what) {}
};

// One step entry as it travels: owns what StepItem points at.
struct StepEntry {
    SeqId seq = 0;
    bool sample = false, logits = false;
    bool verify = false;        // tokens are [t, drafts...] (ABI 1.6 EH_STEP_VERIFY)
    std::vector<int32_t> tokens;
    std::optional<std::vector<uint32_t>> allowed;
    std::vector<std::pair<int32_t, float>> bias;
};

struct Request {
    Msg type = Msg::Create;
    SeqId seq = 0;              // Fork (source), Truncate, Release, SetSampling, SetAdapter
    uint32_t n = 0;             // Fork, Truncate: tokens kept; SetAdapter: the adapter; Park: tokens parked
    uint64_t max_bytes = 0;     // Park
    uint64_t parked = 0;        // Unpark, DropParked
    std::vector<int32_t> tokens;  // Unpark
    KvBudget budget;            // KvInit
    eh_sampling_params sampling{};
    std::vector<StepEntry> entries;  // Step
};

struct Reply {
    Msg type = Msg::Error;
    // Error, LoadFailed
    Code code = Code::Internal;
    std::string message;
    // Progress
    float progress = 0;
    // Ready
    EngineFacts facts;
    // every reply to a request but Residency
    uint32_t free_blocks = 0;
    SeqId seq = 0;                  // Create, Fork, Unpark (0: the KV blocks do not suffice)
    bool can_park = false;          // KvInit: the engine has the host tier's calls
    uint64_t parked = 0;            // Park (0: not parked)
    uint64_t parked_bytes = 0;      // Park: the bytes it holds (or would)
    SeqLimits limits;               // KvInit
    bool has_logits = false;        // KvInit
    uint64_t device_bytes = 0;      // KvInit: held after the KV cache
    bool kv_full = false;           // Step
    std::vector<int32_t> tokens;    // Step, one per entry
    std::vector<uint32_t> accepted; // Step, one per entry: a verify entry's drafts accepted, else 0
    std::vector<std::vector<float>> logits;  // Step, one per entry (empty unless asked)
    bool resident = true;           // Residency (why in message)
};

// Encoders return a whole frame (length prefix included).
std::vector<uint8_t> encode_request(Msg type, SeqId seq = 0, uint32_t n = 0);
std::vector<uint8_t> encode_kv_init(const KvBudget& b);
std::vector<uint8_t> encode_set_sampling(SeqId seq, const eh_sampling_params& p);
std::vector<uint8_t> encode_step(std::span<const StepItem> items);
std::vector<uint8_t> encode_park(SeqId seq, uint32_t n, uint64_t max_bytes);
std::vector<uint8_t> encode_unpark(uint64_t parked, std::span<const int32_t> tokens);
std::vector<uint8_t> encode_drop_parked(uint64_t parked);
std::vector<uint8_t> encode_reply(const Reply& r);

// Decoders take a body (no length prefix) and throw ProtocolError.
Request decode_request(std::span<const uint8_t> body);
Reply decode_reply(std::span<const uint8_t> body);

// The body length a frame header announces; ProtocolError above kMaxFrame.
uint32_t frame_length(const uint8_t header[4]);

// Blocking frame I/O on a stream socket. Closed: the other end is gone (EOF,
// EPIPE, ECONNRESET). Abandoned: `keep_waiting`, asked every 50 ms while
// the read or write waits, said no. A bad length throws ProtocolError.
enum class Io { Ok, Closed, Abandoned };
Io write_frame(int fd, std::span<const uint8_t> frame, const std::function<bool()>& keep_waiting = {});
Io read_frame(int fd, std::vector<uint8_t>& body, const std::function<bool()>& keep_waiting = {});

}  // namespace eh::service::wire
