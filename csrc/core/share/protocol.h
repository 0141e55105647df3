// The sharing daemon's wire protocol (emugpud and the processes attached to
// it), as pure functions. A message is a fixed header
//   magic u32 "EMGS" | version u16 | type u16 | id u32 | length u32   (little-endian)
// then `length` payload bytes (at most kMaxPayload). A request's id comes
// back in its reply. Payload fields are fixed-width integers and strings
// (u32 length, then the bytes, at most kMaxString). Decoders check every
// length before reading: a peer that sends garbage or truncated messages
// makes them throw emugpu::Error (its connection is dropped), never crash.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "time_share.h"

namespace emugpu::share {

constexpr uint32_t kMagic = 0x53474d45;  // "EMGS"
// 2: time sharing (priority, share reports); 3: MIG instances; 4: MPS (SM demand in share reports);
// 5: MPS demand histograms in share reports; 6: their bins split by bandwidth, with its share per bin
constexpr uint16_t kVersion = 6;
constexpr size_t kHeaderBytes = 16;
// Far above any message (a status of a thousand clients is ~100 kB), small
// enough that a garbage length is caught at once.
constexpr uint32_t kMaxPayload = 1u << 20;
constexpr uint32_t kMaxString = 4096;
constexpr uint32_t kMaxGpus = 64;
constexpr uint32_t kMaxClients = 1024;  // connections the daemon accepts at once
constexpr uint32_t kMaxName = 256;      // of a process's name, as the daemon keeps it
constexpr uint32_t kPpm = 1000000;      // fractions travel in millionths
constexpr int64_t kNoTime = INT64_MAX;

enum class MessageType : uint16_t {
  kHello = 1,        // process -> daemon: attach (pid, clock, name)
  kWelcome = 2,      // its client id and the GPUs
  kReserve = 3,      // take bytes of a GPU's memory (a new segment)
  kGranted = 4,      //
  kRefused = 5,      // the GPU's capacity, what all clients hold, what this one holds
  kRelease = 6,      // give bytes back
  kReleased = 7,     //
  kStatus = 8,       // anyone: the GPUs and the attached processes (smi)
  kStatusReply = 9,  //
  kError = 10,       // the request was refused; the message says why
  kShare = 11,       // process -> daemon: how busy its compute engine was on a GPU (a ShareReport)
  kShareReply = 12,  // the share of that GPU's compute it gets now (a ShareGrant)
};
const char* message_type_name(MessageType type);

struct Message {
  MessageType type = MessageType::kError;
  uint32_t id = 0;
  std::vector<uint8_t> payload;
};

struct Hello {
  int64_t pid = 0;
  std::string clock;     // "real" or "virtual": every attached process must run the same
  std::string name;      // the process's command, for smi
  int32_t priority = 0;  // EMUGPU_PRIORITY: higher runs first under --sharing priority
};

// One of the daemon's devices: a whole GPU, or a MIG instance of one.
struct GpuInfo {
  std::string name;         // the catalog's full name (of the instance's GPU for a MIG instance)
  uint64_t capacity = 0;    // what the processes may allocate together (CUDA's usable memory)
  uint64_t total = 0;       // the GPU's (or instance's) memory
  int32_t gpu = 0;          // the physical GPU's index on the node
  int32_t instance = -1;    // its MIG instance's index on that GPU; -1: the whole GPU
  std::string mig_profile;  // "3g.40gb"; empty for a whole GPU
  std::string uuid;         // "MIG-..." for an instance
};

struct Welcome {
  uint64_t client = 0;
  std::vector<GpuInfo> gpus;
  std::string sharing;    // the daemon's time-sharing policy ("none": memory only)
  int64_t report_ns = 0;  // real time between a process's share reports
  int64_t window_ns = 0;  // the clock time a reported busy fraction averages over
  int64_t now_ns = 0;     // the earliest time the attached processes reported (0: none): a
                          // virtual clock joins there
};

// A process's compute on one GPU, reported every Welcome::report_ns of real
// time while it launches work (never per op).
struct ShareReport {
  uint32_t gpu = 0;
  uint32_t busy_ppm = 0;       // fraction of the recent window its compute engine had work, in millionths
  int64_t iteration_ns = 0;    // its compute work between host waits, on the GPU alone (recent average)
  int64_t now_ns = 0;          // its clock's time
  int64_t busy_until_ns = 0;   // where the compute it launched so far ends
  uint32_t demand_ppm = kPpm;  // fraction of the whole GPU's SMs its kernels hold while they run (MPS)
  int64_t hold_ns = 0;         // how long its kernels' blocks hold an SM, alone (MPS)
  // Its kernels by demand (time_share.h's kDemandBins bins): the fraction of
  // its kernel time in each, their mean demand of the whole GPU's SMs, their
  // blocks' mean hold time, their mean duration, the mean share of the peak
  // memory bandwidth they draw. All fractions 0: none reported (use the means).
  struct Bin {
    uint32_t fraction_ppm = 0;
    uint32_t demand_ppm = 0;
    int64_t hold_ns = 0;
    int64_t kernel_ns = 0;
    uint32_t bandwidth_ppm = 0;
  };
  std::array<Bin, kDemandBins> bins{};
};

struct ShareGrant {
  uint32_t rate_ppm = 0;         // its compute runs at this fraction of the GPU's speed, in millionths (> 0)
  uint32_t sharers = 0;          // other processes that reported work on the GPU recently
  int64_t lowest_now = kNoTime;  // the earliest time another live process reported (kNoTime: none)
};

// kReserve and kRelease.
struct Bytes {
  uint32_t gpu = 0;
  uint64_t bytes = 0;
};

struct Refused {
  uint64_t capacity = 0;
  uint64_t used = 0;  // by every attached process, this one included
  uint64_t mine = 0;
};

struct ClientInfo {
  uint64_t id = 0;
  int64_t pid = 0;
  std::string clock;
  std::string name;
  std::vector<uint64_t> bytes;  // per GPU
  int32_t priority = 0;
  std::vector<uint32_t> busy_ppm;  // per GPU: its last fresh share report (0: none)
  std::vector<uint32_t> rate_ppm;  // per GPU: the share it was granted (1e6: the whole GPU)
};

struct Status {
  std::string sharing;
  std::vector<GpuInfo> gpus;
  std::vector<uint64_t> used;  // per GPU, by every client
  std::vector<ClientInfo> clients;
};

std::vector<uint8_t> encode(MessageType type, uint32_t id, const std::vector<uint8_t>& payload = {});
std::vector<uint8_t> encode_hello(uint32_t id, const Hello& hello);
std::vector<uint8_t> encode_welcome(uint32_t id, const Welcome& welcome);
std::vector<uint8_t> encode_bytes(MessageType type, uint32_t id, const Bytes& bytes);
std::vector<uint8_t> encode_refused(uint32_t id, const Refused& refused);
std::vector<uint8_t> encode_status(uint32_t id, const Status& status);
std::vector<uint8_t> encode_error(uint32_t id, const std::string& message);
std::vector<uint8_t> encode_share(uint32_t id, const ShareReport& report);
std::vector<uint8_t> encode_share_reply(uint32_t id, const ShareGrant& grant);

// Each throws emugpu::Error (kRuntime) when `m` is not a well-formed message of its type.
Hello decode_hello(const Message& m);
Welcome decode_welcome(const Message& m);
Bytes decode_bytes(const Message& m);
Refused decode_refused(const Message& m);
Status decode_status(const Message& m);
std::string decode_error(const Message& m);
ShareReport decode_share(const Message& m);
ShareGrant decode_share_reply(const Message& m);

// Cuts a byte stream into messages.
class Parser {
 public:
  // `peer` names the other end in errors ("client 3", "unix:/run/emugpud.sock").
  explicit Parser(std::string peer) : peer_(std::move(peer)) {}
  // Appends what the socket delivered; throws on a malformed header (wrong
  // magic or version, unknown type, a length beyond kMaxPayload).
  void feed(const uint8_t* data, size_t length);
  // Moves the next whole message into `out`; false until one is complete.
  bool next(Message& out);
  // Bytes of an incomplete message: non-zero when the peer hung up mid-message.
  size_t pending() const { return buffer_.size(); }

 private:
  std::string peer_;
  std::vector<uint8_t> buffer_;
  std::deque<Message> ready_;
};

}  // namespace emugpu::share
