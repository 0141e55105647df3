#include "exchange/clock_offset.h"

#include <cstring>
#include <vector>

#include "error.h"

namespace emugpu {

namespace {
TimeNs read_time(const Bytes& message, int peer) {
  EMUGPU_CHECK(message.size() == sizeof(TimeNs), kRuntime, "clock offset: expected ", sizeof(TimeNs),
               " bytes from rank ", peer, ", got ", message.size());
  TimeNs t;
  std::memcpy(&t, message.data(), sizeof(t));
  return t;
}
}  // namespace

ClockSample clock_sample(TimeNs sent, TimeNs theirs, TimeNs back) {
  // The peer read its clock somewhere in the round trip; the middle is the best guess.
  return {sent + (back - sent) / 2 - theirs, back - sent};
}

TimeNs measure_clock_offset(TcpTransport& transport, int peer, const std::function<TimeNs()>& clock, int rounds,
                            std::chrono::nanoseconds timeout) {
  EMUGPU_CHECK(rounds >= 1, kValue, "clock offset: expected at least 1 round, got ", rounds);
  ClockSample best{0, -1};
  for (int i = 0; i < rounds; ++i) {
    const TimeNs sent = clock();
    transport.send(peer, kClockChannel, &sent, sizeof(sent));
    const TimeNs theirs = read_time(transport.recv(peer, kClockChannel, timeout), peer);
    const ClockSample s = clock_sample(sent, theirs, clock());
    if (best.round_trip < 0 || s.round_trip < best.round_trip) best = s;
  }
  return best.offset;
}

void serve_clock(TcpTransport& transport, int peer, const std::function<TimeNs()>& clock, int rounds,
                 std::chrono::nanoseconds timeout) {
  for (int i = 0; i < rounds; ++i) {
    (void)read_time(transport.recv(peer, kClockChannel, timeout), peer);
    const TimeNs now = clock();
    transport.send(peer, kClockChannel, &now, sizeof(now));
  }
}

}  // namespace emugpu
