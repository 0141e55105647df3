#include "exchange/words.h"

#include <algorithm>
#include <utility>

#include "error.h"

namespace emugpu {

void CollectiveWords::encode(int64_t* out) const {
  out[kStart] = start;
  out[kReal] = real ? 1 : 0;
  out[kCompute] = compute ? 1 : 0;
  out[kSignature] = static_cast<int64_t>(signature);
  out[kModelBytes] = model_bytes;
  out[kLargest] = largest;
  out[kPayload] = payload;
}

GatheredWords::GatheredWords(std::vector<int64_t> rows, int size) : rows_(std::move(rows)), size_(size) {
  EMUGPU_CHECK(size >= 1 && rows_.size() == static_cast<size_t>(size) * CollectiveWords::kCount, kValue,
               "collective words: expected ", size, " ranks x ", static_cast<int>(CollectiveWords::kCount),
               " words, got ", rows_.size(), " words");
}

int64_t GatheredWords::at(int rank, CollectiveWords::Index w) const {
  EMUGPU_CHECK(rank >= 0 && rank < size_, kIndex, "collective words: expected a rank in [0, ", size_, "), got ", rank);
  return rows_[static_cast<size_t>(rank) * CollectiveWords::kCount + w];
}

int64_t GatheredWords::max(CollectiveWords::Index w) const {
  int64_t m = rows_[w];
  for (size_t i = w; i < rows_.size(); i += CollectiveWords::kCount) m = std::max(m, rows_[i]);
  return m;
}

bool GatheredWords::all(CollectiveWords::Index w) const {
  for (size_t i = w; i < rows_.size(); i += CollectiveWords::kCount) {
    if (rows_[i] == 0) return false;
  }
  return true;
}

int GatheredWords::first_disagreeing(uint64_t signature) const {
  for (int r = 0; r < size_; ++r) {
    if (at(r, CollectiveWords::kSignature) != static_cast<int64_t>(signature)) return r;
  }
  return -1;
}

bool GatheredWords::moves_bytes(int64_t threshold) const {
  return all(CollectiveWords::kCompute) || (max(CollectiveWords::kLargest) <= threshold && all(CollectiveWords::kReal));
}

CollectiveSignature::CollectiveSignature(const std::string& name, const std::string& extra, size_t tensors) {
  mix_text(name);
  mix_text(extra);
  mix(tensors);
}

void CollectiveSignature::add_tensor(const int64_t* sizes, int64_t dim, int64_t dtype) {
  mix(static_cast<uint64_t>(dim));
  for (int64_t i = 0; i < dim; ++i) mix(static_cast<uint64_t>(sizes[i]));
  mix(static_cast<uint64_t>(dtype));
}

void CollectiveSignature::mix(uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h_ ^= (v >> (8 * i)) & 0xff;
    h_ *= 1099511628211ull;
  }
}

void CollectiveSignature::mix_text(const std::string& s) {
  for (unsigned char c : s) {
    h_ ^= c;
    h_ *= 1099511628211ull;
  }
  mix(s.size());
}

namespace {
std::string quoted(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size() && out.size() < kMaxReportChars; ++i) {
    const auto ch = static_cast<unsigned char>(text[i]);
    if (ch >= 0x20 && ch < 0x7f) {
      out.push_back(static_cast<char>(ch));
    } else {
      static const char* kHex = "0123456789abcdef";
      out += {'\\', 'x', kHex[ch >> 4], kHex[ch & 15]};
    }
  }
  if (out.size() >= kMaxReportChars) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}
}  // namespace

std::string disagreement_message(int rank, const std::string& mine, int other, const std::string& theirs) {
  return "emu backend: ranks disagree on a collective: rank " + std::to_string(rank) + " called " + mine +
         " but rank " + std::to_string(other) + " called " + quoted(theirs) +
         "; every rank must call the same collective with the same shapes and dtypes";
}

}  // namespace emugpu
