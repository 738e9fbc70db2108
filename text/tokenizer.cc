// ByteTokenizer and UTF-8 repair.
#include "text/tokenizer.h"

namespace moeserve {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";

// Length of the valid UTF-8 sequence starting at s[i], 0 when invalid, -1 when truncated
// (a valid prefix that runs past the end).
int SequenceLength(absl::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  int len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 < 0x80) return 1;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return 0;
  }
  for (int k = 1; k < len; ++k) {
    if (i + k >= s.size()) return -1;
    const auto b = static_cast<unsigned char>(s[i + k]);
    const unsigned char klo = k == 1 ? lo : 0x80, khi = k == 1 ? hi : 0xBF;
    if (b < klo || b > khi) return 0;
  }
  return len;
}

// Bytes in the maximal subpart of an ill-formed sequence at s[i]: the lead byte and the
// continuation bytes that a valid sequence could still have had (Unicode's "substitution of
// maximal subparts", which Rust's String::from_utf8_lossy follows).
size_t MaximalSubpart(absl::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 1;
  }
  size_t k = 1;
  for (; k < len && i + k < s.size(); ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) break;
  }
  return k;
}

}  // namespace

std::string Utf8Lossy(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const int len = SequenceLength(s, i);
    if (len > 0) {
      out.append(s.data() + i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
    } else {
      out.append(kReplacement);
      i += MaximalSubpart(s, i);
    }
  }
  return out;
}

std::vector<int32_t> ByteTokenizer::Bytes(absl::string_view text, bool add_bos) {
  std::vector<int32_t> ids;
  ids.reserve(text.size() + 1);
  if (add_bos) ids.push_back(kBos);
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

std::string ByteTokenizer::Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const {
  IncrementalDecoder dec;
  std::string out;
  for (int32_t id : ids) {
    if (!skip_special_tokens && IsSpecialId(id)) {
      out += dec.Flush();
      out += id == kBos ? "<bos>" : id == kEos ? "<eos>" : "<pad>";
      continue;
    }
    out += dec.Push(id);
  }
  out += dec.Flush();
  return out;
}

std::optional<int32_t> ByteTokenizer::TokenId(absl::string_view token) const {
  if (token == "<bos>") return kBos;
  if (token == "<eos>") return kEos;
  if (token == "<pad>") return kPad;
  if (token.size() == 1) return static_cast<unsigned char>(token[0]);
  return std::nullopt;
}

std::string SanitizeUtf8(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const int len = SequenceLength(s, i);
    if (len > 0) {
      out.append(s.data() + i, len);
      i += len;
    } else if (len == -1) {
      out.append(kReplacement);  // a truncated tail is one character
      break;
    } else {
      out.append(kReplacement);  // one per invalid byte, as IncrementalDecoder does
      ++i;
    }
  }
  return out;
}

std::optional<size_t> FirstInvalidUtf8(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const int len = SequenceLength(s, i);
    if (len <= 0) return i;
    i += static_cast<size_t>(len);
  }
  return std::nullopt;
}

std::string IncrementalDecoder::Push(int32_t id) {
  std::string out;
  if (id < 0 || id > 255) {
    // A non-byte id ends any pending sequence.
    out = Flush();
    if (!ByteTokenizer::IsSpecialId(id)) out.append(kReplacement);
    return out;
  }
  pending_.push_back(static_cast<char>(id));
  // Emit the longest prefix that holds only complete or definitely invalid sequences.
  size_t i = 0;
  while (i < pending_.size()) {
    const int len = SequenceLength(pending_, i);
    if (len == -1) break;  // wait for more bytes
    if (len > 0) {
      out.append(pending_, i, len);
      i += len;
    } else {
      out.append(kReplacement);
      ++i;
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string IncrementalDecoder::Flush() {
  // pending_ only ever holds the start of a truncated sequence.
  if (pending_.empty()) return "";
  pending_.clear();
  return std::string(kReplacement);
}

}  // namespace moeserve
