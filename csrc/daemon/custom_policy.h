// Sharing policies outside emugpud's core, chosen at start-up without
// rebuilding the daemon:
//  - "plugin:PATH": a shared library exporting emugpu_share_policy
//    (emugpu_policy.h), loaded with dlopen;
//  - "exec:COMMAND": a program (`sh -c COMMAND`) that answers one line per
//    request on its standard output; `torch-emugpu daemon --sharing
//    python:FILE` runs a Python function this way (torch_emugpu/sharing_policy.py).
// A request is one line: the number of others, then busy, iteration_ns,
// priority, demand and hold_ns of `me` and of each other, space-separated;
// the answer is the share, one number. A program that dies, answers garbage
// or takes longer than a second is given up: the daemon warns once on
// stderr and time-slices from then on.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "daemon/policy.h"

namespace emugpu::share {

using CustomPolicy = std::function<double(const Sharer& me, const std::vector<Sharer>& others)>;

// Whether `spec` names a custom policy ("plugin:" or "exec:").
bool is_custom_policy(const std::string& spec);
// Loads it (starts the program); throws kValue naming what failed.
CustomPolicy load_custom_policy(const std::string& spec);

}  // namespace emugpu::share
