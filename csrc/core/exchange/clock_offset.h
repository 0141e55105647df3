// How far apart two ranks' steady clocks are, for groups whose ranks do not
// share one clock (other machines, other time namespaces): NTP's estimate
// from the round trip with the shortest time, whose error is at most half
// that round trip. The virtual clock's timestamps use the same offsets.
#pragma once

#include <chrono>
#include <functional>

#include "clock.h"
#include "exchange/tcp_transport.h"

namespace emugpu {

// The channel clock measurements use; above every channel callers derive
// from user tags.
constexpr uint64_t kClockChannel = uint64_t{1} << 62;

// One round trip: this rank sent at `sent`, the peer read `theirs`, the
// answer came back at `back`. Returns (offset, round trip) with offset =
// this clock minus the peer's.
struct ClockSample {
  TimeNs offset;
  TimeNs round_trip;
};
ClockSample clock_sample(TimeNs sent, TimeNs theirs, TimeNs back);

// This rank's `clock` minus `peer`'s, while `peer` runs serve_clock().
TimeNs measure_clock_offset(TcpTransport& transport, int peer, const std::function<TimeNs()>& clock, int rounds,
                            std::chrono::nanoseconds timeout);
// The other side of `peer`'s measure_clock_offset().
void serve_clock(TcpTransport& transport, int peer, const std::function<TimeNs()>& clock, int rounds,
                 std::chrono::nanoseconds timeout);

}  // namespace emugpu
