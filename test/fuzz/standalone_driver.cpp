// A stand-in for libFuzzer where the compiler has none (g++): runs
// LLVMFuzzerTestOneInput over the seed files, then over seeded random
// mutations of them, for -runs=N inputs or -max_total_time=T seconds.
// Without coverage feedback it leans on JSON-aware mutations (brackets,
// huge numbers, type swaps). Flags follow libFuzzer's so scripts can use
// either:
//   emugpu_parser_fuzz [-runs=N] [-max_total_time=T] [-seed=S] DIR_OR_FILE...
// On a finding the input is written to crash-input.json in the current
// directory (replay: emugpu_parser_fuzz -runs=0 crash-input.json).
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
// Present only in sanitizer builds; lets us save the input before a report exits.
extern "C" void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

namespace {

constexpr size_t kMaxInput = 256 << 10;

// This target's name (argv[0]'s last component) for its messages.
const char* g_name = "emugpu_fuzz";
// The input being run, for the crash handlers; written before each run.
const char* g_current = nullptr;
size_t g_current_size = 0;

void save_current() {
  // Async-signal-safe: called from signal handlers.
  const int fd = open("crash-input.json", O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  for (size_t done = 0; done < g_current_size;) {
    const ssize_t n = write(fd, g_current + done, g_current_size - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  close(fd);
  const char msg[] = ": input saved to crash-input.json\n";
  (void)!write(2, g_name, strlen(g_name));  // strlen and write are async-signal-safe
  (void)!write(2, msg, sizeof msg - 1);
}

void on_signal(int sig) {
  save_current();
  signal(sig, SIG_DFL);
  raise(sig);
}

void run_one(const std::string& input) {
  g_current = input.data();
  g_current_size = input.size();
  try {
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  } catch (const emugpu::Error&) {
    // The target catches these itself; one escaping is still an accepted outcome.
  } catch (const std::exception& e) {
    save_current();
    std::fprintf(stderr, "%s: exception other than emugpu::Error: %s\n", g_name, e.what());
    std::exit(1);
  } catch (...) {
    save_current();
    std::fprintf(stderr, "%s: unknown exception\n", g_name);
    std::exit(1);
  }
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

const char* const kTokens[] = {
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    "\"",
    "null",
    "true",
    "false",
    "0",
    "-0",
    "1",
    "-1",
    "1.5",
    "2.0",
    "1e9",
    "1e308",
    "-1e308",
    "1e400",
    "-1e400",
    "4e-320",
    "1e-400",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "9223372036854775807",
    "2147483648",
    "4294967296",
    "\"\"",
    "\"x\"",
    "[]",
    "{}",
    "[[[[[[[[",
    "{\"a\":{\"a\":",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "\xff",
    "\"batch_size\": ",
    "\"forward_s\": ",
    "\"backward_s\": ",
    "\"gpu_count\": ",
    "\"sm_count\": ",
    "\"memory_gib\": ",
    "\"compute_capability\": \"99999999999.99999999999\"",
    "\"peak_bytes\": ",
    "\"data_parallel\": [",
    "\"gpus\": [",
    "\"aliases\": ",
    "\"fingerprint\": {\"parameters\": ",
};

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  size_t below(size_t n) { return n == 0 ? 0 : std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }

  std::string mutate(std::string s, const std::vector<std::string>& pool) {
    // Mostly one edit: a single edit of a valid file reaches the validators,
    // several rarely get past the JSON syntax check.
    const size_t steps = below(4) == 0 ? 2 + below(5) : 1;
    for (size_t i = 0; i < steps; ++i) step(s, pool);
    if (s.size() > kMaxInput) s.resize(kMaxInput);
    return s;
  }

 private:
  void step(std::string& s, const std::vector<std::string>& pool) {
    const size_t at = below(s.size() + 1);
    switch (below(12)) {
      case 0:  // flip a bit
        if (!s.empty()) s[below(s.size())] ^= static_cast<char>(1u << below(8));
        break;
      case 1:  // insert a random byte
        s.insert(at, 1, static_cast<char>(below(256)));
        break;
      case 2:  // delete a short range
        if (!s.empty()) s.erase(below(s.size()), 1 + below(16));
        break;
      case 3:
      case 4:  // splice in a JSON token
        s.insert(at, kTokens[below(std::size(kTokens))]);
        break;
      case 5:
      case 10:
      case 11: {  // replace the number at a random place with a token
        size_t b = below(s.size() + 1);
        while (b < s.size() && !(std::isdigit(static_cast<unsigned char>(s[b])) || s[b] == '-')) ++b;
        size_t e = b;
        while (e < s.size() && std::strchr("0123456789+-.eE", s[e]) != nullptr) ++e;
        s.replace(b, e - b, kTokens[below(std::size(kTokens))]);
        break;
      }
      case 6: {  // deep nesting, sometimes far past any limit
        const size_t depth = below(16) == 0 ? 100000 : 1 + below(80);
        std::string open, close;
        for (size_t d = 0; d < depth; ++d) {
          const bool array = below(2) == 0;
          open += array ? "[" : "{\"k\":";
          close += array ? ']' : '}';
        }
        std::reverse(close.begin(), close.end());
        s.insert(at, below(2) == 0 ? open + "1" + close : open);
        break;
      }
      case 7: {  // duplicate a chunk of the input in place
        if (s.empty()) break;
        const size_t b = below(s.size());
        s.insert(at, s.substr(b, 1 + below(64)));
        break;
      }
      case 8: {  // crossover with another input
        const std::string& other = pool[below(pool.size())];
        if (other.empty()) break;
        const size_t b = below(other.size());
        s.replace(at, below(64), other.substr(b, 1 + below(256)));
        break;
      }
      default: {  // a long string or digit run
        const char c = below(2) == 0 ? 'x' : '7';
        s.insert(at, std::string(1 + below(4096), c));
        break;
      }
    }
  }

  std::mt19937_64 rng_;
};

bool flag(const char* arg, const char* name, long long& out) {
  const size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0) return false;
  out = std::atoll(arg + n);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 0 && argv[0] != nullptr) {
    const char* slash = std::strrchr(argv[0], '/');
    g_name = slash != nullptr ? slash + 1 : argv[0];
  }
  long long runs = -1, max_seconds = 0, seed = 1;
  std::vector<std::string> seeds;
  for (int i = 1; i < argc; ++i) {
    if (flag(argv[i], "-runs=", runs) || flag(argv[i], "-max_total_time=", max_seconds) ||
        flag(argv[i], "-seed=", seed)) {
      continue;
    }
    if (argv[i][0] == '-') {
      std::fprintf(stderr, "%s: ignoring unknown flag %s\n", g_name, argv[i]);
      continue;
    }
    const std::filesystem::path path(argv[i]);
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
      for (const auto& entry : std::filesystem::directory_iterator(path)) {
        if (entry.is_regular_file()) seeds.push_back(read_file(entry.path()));
      }
    } else if (std::filesystem::is_regular_file(path, ec)) {
      seeds.push_back(read_file(path));
    } else {
      std::fprintf(stderr, "%s: no such file or directory: %s\n", g_name, argv[i]);
      return 2;
    }
  }
  if (runs < 0 && max_seconds <= 0) runs = 100000;  // bounded by default
  if (__sanitizer_set_death_callback != nullptr) {
    __sanitizer_set_death_callback(save_current);
  } else {
    for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL}) signal(sig, on_signal);
  }
  if (seeds.empty()) seeds.push_back("{}");

  for (const auto& s : seeds) run_one(s);  // replays, as libFuzzer does
  std::vector<std::string> pool = seeds;
  Mutator mutator(static_cast<uint64_t>(seed));
  const auto start = std::chrono::steady_clock::now();
  long long done = 0;
  for (; runs < 0 || done < runs; ++done) {
    if (max_seconds > 0 && done % 64 == 0 &&
        std::chrono::steady_clock::now() - start >= std::chrono::seconds(max_seconds)) {
      break;
    }
    // Half the time a seed: mutants of mutants drift away from valid JSON.
    const size_t base = mutator.below(2) == 0 ? mutator.below(seeds.size()) : mutator.below(pool.size());
    std::string input = mutator.mutate(pool[base], pool);
    run_one(input);
    // No coverage signal: keep a bounded, rotating set of mutants so that
    // mutations compound, while the seeds stay in the pool for good.
    if (mutator.below(8) == 0) {
      if (pool.size() < seeds.size() + 256)
        pool.push_back(std::move(input));
      else
        pool[seeds.size() + mutator.below(256)] = std::move(input);
    }
  }
  std::fprintf(stderr, "%s: %zu seeds, %lld mutated inputs, seed %lld, no findings\n", g_name, seeds.size(), done,
               seed);
  return 0;
}
