// tokenizer.json's normalizers and pre-tokenizers, with the semantics of the tokenizers library
// (version 0.22): regexes on PCRE2 (Unicode properties on), Unicode normalization on utf8proc.
#include "text/hf_text.h"

#include <utf8proc.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "core/status.h"
#include "nlohmann/json.hpp"
#include "text/regex.h"
#include "text/utf8_chars.h"

namespace moeserve {

namespace {

using Json = nlohmann::json;

constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct Segment {
  size_t start, end;
  bool is_match;
};

// The matches of a literal or a regex, and the gaps between them, covering all of `s`.
absl::StatusOr<std::vector<Segment>> FindSegments(absl::string_view s, const std::string& literal,
                                                  const Regex* regex) {
  std::vector<std::pair<size_t, size_t>> matches;
  if (regex != nullptr) {
    ASSIGN_OR_RETURN(matches, regex->Find(s));
  } else {
    for (size_t p = s.find(literal); p != absl::string_view::npos; p = s.find(literal, p)) {
      matches.emplace_back(p, p + literal.size());
      p += literal.size();
    }
  }
  std::vector<Segment> segs;
  size_t prev = 0;
  for (const auto& [start, end] : matches) {
    if (start != prev) segs.push_back({prev, start, false});
    segs.push_back({start, end, true});
    prev = end;
  }
  if (prev != s.size()) segs.push_back({prev, s.size(), false});
  return segs;
}

// tokenizers' NormalizedString::split: folds the segments by `behavior`, drops empty pieces.
std::vector<TextPiece> SplitPiece(const TextPiece& piece, std::vector<Segment> segs,
                                  SplitBehavior behavior, bool invert) {
  if (invert) {
    for (auto& s : segs) s.is_match = !s.is_match;
  }
  std::vector<std::pair<size_t, size_t>> kept;  // ranges that become pieces
  bool prev_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const auto& s : segs) {
        if (!s.is_match) kept.emplace_back(s.start, s.end);
      }
      break;
    case SplitBehavior::kIsolated:
      for (const auto& s : segs) kept.emplace_back(s.start, s.end);
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const auto& s : segs) {
        if (s.is_match && !prev_match && !kept.empty()) {
          kept.back().second = s.end;
        } else {
          kept.emplace_back(s.start, s.end);
        }
        prev_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
        if (it->is_match && !prev_match && !kept.empty()) {
          kept.back().first = it->start;
        } else {
          kept.emplace_back(it->start, it->end);
        }
        prev_match = it->is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    case SplitBehavior::kContiguous:
      for (size_t i = 0; i < segs.size(); ++i) {
        if (i > 0 && segs[i].is_match == prev_match) {
          kept.back().second = segs[i].end;
        } else {
          kept.emplace_back(segs[i].start, segs[i].end);
        }
        prev_match = segs[i].is_match;
      }
      break;
  }
  std::vector<TextPiece> out;
  for (const auto& [start, end] : kept) {
    if (end > start)
      out.push_back({piece.text.substr(start, end - start), piece.at_start && start == 0});
  }
  return out;
}

absl::StatusOr<std::string> ReplaceAll(const std::string& s, const std::string& literal,
                                       const Regex* regex, const std::string& content) {
  ASSIGN_OR_RETURN(std::vector<Segment> segs, FindSegments(s, literal, regex));
  std::string out;
  for (const auto& seg : segs) {
    if (seg.is_match) {
      out += content;
    } else {
      out.append(s, seg.start, seg.end - seg.start);
    }
  }
  return out;
}

// A Split or Replace "pattern": {"String": "..."} or {"Regex": "..."}.
absl::Status ReadPattern(const Json& j, const std::string& where, std::string* literal,
                         std::shared_ptr<const Regex>* regex) {
  if (j.is_object() && j.contains("String") && j["String"].is_string()) {
    *literal = j["String"].get<std::string>();
    if (literal->empty()) return absl::InvalidArgumentError(where + ": empty pattern");
    return absl::OkStatus();
  }
  if (j.is_object() && j.contains("Regex") && j["Regex"].is_string()) {
    ASSIGN_OR_RETURN(*regex, Regex::Compile(j["Regex"].get<std::string>()));
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(where +
                                    ": pattern must be {\"String\": ...} or {\"Regex\": ...}");
}

std::string StrField(const Json& j, const char* key, const std::string& fallback) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : fallback;
}
bool BoolField(const Json& j, const char* key, bool fallback) {
  return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : fallback;
}

absl::Status AddNormalizer(const Json& j, std::vector<NormalizerStep>* out) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = StrField(j, "type", "");
  using K = NormalizerStep::Kind;
  if (type == "Sequence") {
    for (const Json& n : j.value("normalizers", Json::array()))
      RETURN_IF_ERROR(AddNormalizer(n, out));
    return absl::OkStatus();
  }
  NormalizerStep step{};
  if (type == "Prepend") {
    step.kind = K::kPrepend;
    step.text = StrField(j, "prepend", "");
  } else if (type == "Replace") {
    step.kind = K::kReplace;
    RETURN_IF_ERROR(
        ReadPattern(j.value("pattern", Json()), "normalizer Replace", &step.text, &step.regex));
    step.content = StrField(j, "content", "");
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    step.kind = type == "NFC"    ? K::kNfc
                : type == "NFD"  ? K::kNfd
                : type == "NFKC" ? K::kNfkc
                                 : K::kNfkd;
  } else if (type == "Strip") {
    step.kind = K::kStrip;
    step.left = BoolField(j, "strip_left", true);
    step.right = BoolField(j, "strip_right", true);
  } else {
    return absl::UnimplementedError(absl::StrCat("tokenizer.json: normalizer \"", type,
                                                 "\" is not supported (supported: Sequence, "
                                                 "Prepend, Replace, NFC, NFD, NFKC, NFKD, Strip)"));
  }
  out->push_back(std::move(step));
  return absl::OkStatus();
}

absl::StatusOr<SplitBehavior> ReadBehavior(const std::string& b) {
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer.json: Split behavior \"", b, "\" is unknown"));
}

absl::Status AddPreTokenizer(const Json& j, std::vector<PreTokenizerStep>* out) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = StrField(j, "type", "");
  using K = PreTokenizerStep::Kind;
  if (type == "Sequence") {
    for (const Json& p : j.value("pretokenizers", Json::array()))
      RETURN_IF_ERROR(AddPreTokenizer(p, out));
    return absl::OkStatus();
  }
  PreTokenizerStep step{};
  if (type == "ByteLevel") {
    step.kind = K::kByteLevel;
    step.add_prefix_space = BoolField(j, "add_prefix_space", true);
    step.use_regex = BoolField(j, "use_regex", true);
    if (step.use_regex) {
      ASSIGN_OR_RETURN(step.regex, Regex::Compile(kGpt2Pattern));
    }
  } else if (type == "Split") {
    step.kind = K::kSplit;
    RETURN_IF_ERROR(
        ReadPattern(j.value("pattern", Json()), "pre_tokenizer Split", &step.literal, &step.regex));
    ASSIGN_OR_RETURN(step.behavior, ReadBehavior(StrField(j, "behavior", "")));
    step.invert = BoolField(j, "invert", false);
  } else if (type == "Metaspace") {
    step.kind = K::kMetaspace;
    step.replacement = StrField(j, "replacement", "\xE2\x96\x81");
    if (step.replacement.empty())
      return absl::InvalidArgumentError("tokenizer.json: Metaspace replacement is empty");
    const std::string scheme = StrField(j, "prepend_scheme", "");
    if (scheme.empty()) {  // the older form
      step.prepend = BoolField(j, "add_prefix_space", true) ? PreTokenizerStep::Prepend::kAlways
                                                            : PreTokenizerStep::Prepend::kNever;
    } else if (scheme == "always" || scheme == "first" || scheme == "never") {
      step.prepend = scheme == "always"  ? PreTokenizerStep::Prepend::kAlways
                     : scheme == "first" ? PreTokenizerStep::Prepend::kFirst
                                         : PreTokenizerStep::Prepend::kNever;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: Metaspace prepend_scheme \"", scheme, "\" is unknown"));
    }
    step.split = BoolField(j, "split", true);
    step.literal = step.replacement;
    step.behavior = SplitBehavior::kMergedWithNext;
  } else if (type == "Digits") {
    step.kind = K::kDigits;
    step.individual_digits = BoolField(j, "individual_digits", false);
    ASSIGN_OR_RETURN(step.regex, Regex::Compile(R"(\p{N})"));
    step.behavior = step.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous;
  } else {
    return absl::UnimplementedError(absl::StrCat(
        "tokenizer.json: pre_tokenizer \"", type,
        "\" is not supported (supported: Sequence, ByteLevel, Split, Metaspace, Digits)"));
  }
  out->push_back(std::move(step));
  return absl::OkStatus();
}

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

absl::StatusOr<TextPipeline> TextPipeline::Create(const Json& normalizer,
                                                  const Json& pre_tokenizer) {
  TextPipeline p;
  RETURN_IF_ERROR(AddNormalizer(normalizer, &p.normalizer_));
  RETURN_IF_ERROR(AddPreTokenizer(pre_tokenizer, &p.pre_tokenizer_));
  return p;
}

absl::Status TextPipeline::Normalize(std::string* text) const {
  using K = NormalizerStep::Kind;
  for (const NormalizerStep& n : normalizer_) {
    switch (n.kind) {
      case K::kPrepend:
        if (!text->empty()) text->insert(0, n.text);
        break;
      case K::kReplace: {
        ASSIGN_OR_RETURN(*text, ReplaceAll(*text, n.text, n.regex.get(), n.content));
        break;
      }
      case K::kNfc:
      case K::kNfd:
      case K::kNfkc:
      case K::kNfkd: {
        int options = UTF8PROC_STABLE;
        options |= n.kind == K::kNfc || n.kind == K::kNfkc ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
        if (n.kind == K::kNfkc || n.kind == K::kNfkd) options |= UTF8PROC_COMPAT;
        ASSIGN_OR_RETURN(*text, UnicodeNormalize(*text, options));
        break;
      }
      case K::kStrip: {
        size_t b = 0, e = text->size();
        if (n.left) {
          while (b < e && CharAt(*text, b).space) b += CharAt(*text, b).len;
        }
        if (n.right) {
          while (e > b && CharAt(*text, PrevCharStart(*text, e)).space) e = PrevCharStart(*text, e);
        }
        *text = text->substr(b, e - b);
        break;
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TextPiece>> TextPipeline::PreTokenize(
    std::vector<TextPiece> pieces) const {
  using K = PreTokenizerStep::Kind;
  for (const PreTokenizerStep& step : pre_tokenizer_) {
    std::vector<TextPiece> next;
    for (TextPiece& piece : pieces) {
      switch (step.kind) {
        case K::kByteLevel: {
          if (step.add_prefix_space && !StartsWith(piece.text, " ")) piece.text.insert(0, " ");
          std::vector<TextPiece> words{piece};
          if (step.use_regex) {
            ASSIGN_OR_RETURN(std::vector<Segment> segs,
                             FindSegments(piece.text, "", step.regex.get()));
            words = SplitPiece(piece, std::move(segs), SplitBehavior::kIsolated, false);
          }
          const auto& alphabet = ByteLevelAlphabet();
          for (TextPiece& w : words) {
            std::string mapped;
            for (char c : w.text) mapped += alphabet[static_cast<unsigned char>(c)];
            next.push_back({std::move(mapped), w.at_start});
          }
          break;
        }
        case K::kSplit:
        case K::kDigits: {
          ASSIGN_OR_RETURN(std::vector<Segment> segs,
                           FindSegments(piece.text, step.literal, step.regex.get()));
          for (TextPiece& w : SplitPiece(piece, std::move(segs), step.behavior, step.invert)) {
            next.push_back(std::move(w));
          }
          break;
        }
        case K::kMetaspace: {
          piece.text = absl::StrReplaceAll(piece.text, {{" ", step.replacement}});
          const bool prepend =
              step.prepend == PreTokenizerStep::Prepend::kAlways ||
              (step.prepend == PreTokenizerStep::Prepend::kFirst && piece.at_start);
          if (prepend && !StartsWith(piece.text, step.replacement))
            piece.text.insert(0, step.replacement);
          if (!step.split) {
            next.push_back(std::move(piece));
            break;
          }
          ASSIGN_OR_RETURN(std::vector<Segment> segs,
                           FindSegments(piece.text, step.literal, nullptr));
          for (TextPiece& w : SplitPiece(piece, std::move(segs), step.behavior, false)) {
            next.push_back(std::move(w));
          }
          break;
        }
      }
    }
    pieces = std::move(next);
  }
  return pieces;
}

}  // namespace moeserve
