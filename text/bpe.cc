// BPE tokenization by merge rank.
#include "text/bpe.h"

#include <cstdio>
#include <functional>
#include <queue>

#include "absl/strings/str_cat.h"

namespace moeserve {
namespace {

// Length of the UTF-8 character starting at s[i] (1 for a stray byte).
size_t CharLen(absl::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  const size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
  return i + n <= s.size() ? n : 1;
}

}  // namespace

absl::StatusOr<BpeModel> BpeModel::Create(Options o) {
  BpeModel m;
  int32_t max_id = -1;
  for (const auto& [token, id] : o.vocab) {
    if (id < 0)
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: token \"", token, "\" has id ", id));
    max_id = std::max(max_id, id);
  }
  m.tokens_.assign(static_cast<size_t>(max_id + 1), "");
  for (const auto& [token, id] : o.vocab) m.tokens_[static_cast<size_t>(id)] = token;
  m.vocab_ = std::move(o.vocab);
  for (size_t r = 0; r < o.merges.size(); ++r) {
    const auto& [a, b] = o.merges[r];
    const int32_t ia = m.Find(a), ib = m.Find(b), im = m.Find(a + b);
    if (ia < 0 || ib < 0 || im < 0) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: merge ", r, " (\"", a,
                                                     "\" \"", b,
                                                     "\") names a token not in the vocabulary"));
    }
    const uint64_t key = (static_cast<uint64_t>(ia) << 32) | static_cast<uint32_t>(ib);
    m.merges_.emplace(key, Merge{static_cast<int32_t>(r), im});  // the first (lowest) rank wins
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    m.byte_ids_[b] = m.Find(name);
  }
  m.byte_fallback_ = o.byte_fallback;
  if (!o.unk_token.empty()) {
    m.unk_ = m.Find(o.unk_token);
    if (m.unk_ < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: unk_token \"", o.unk_token, "\" is not in the vocabulary"));
    }
  }
  m.fuse_unk_ = o.fuse_unk;
  m.ignore_merges_ = o.ignore_merges;
  return m;
}

int32_t BpeModel::Find(absl::string_view token) const {
  auto it = vocab_.find(std::string(token));
  return it == vocab_.end() ? -1 : it->second;
}

const std::string& BpeModel::Token(int32_t id) const {
  return id >= 0 && id < size() ? tokens_[static_cast<size_t>(id)] : none_;
}

void BpeModel::Tokenize(absl::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {  // a word in the vocabulary is its own token (Llama 3's setting)
    if (auto whole = Find(word); whole >= 0) {
      out->push_back(whole);
      return;
    }
  }
  std::vector<int32_t> syms;
  for (size_t i = 0; i < word.size();) {
    const size_t n = CharLen(word, i);
    const int32_t id = Find(word.substr(i, n));
    if (id >= 0) {
      syms.push_back(id);
    } else {
      bool bytes_ok = byte_fallback_;
      for (size_t k = 0; bytes_ok && k < n; ++k)
        bytes_ok = byte_ids_[static_cast<unsigned char>(word[i + k])] >= 0;
      if (bytes_ok) {
        for (size_t k = 0; k < n; ++k)
          syms.push_back(byte_ids_[static_cast<unsigned char>(word[i + k])]);
      } else if (unk_ >= 0 && !(fuse_unk_ && !syms.empty() && syms.back() == unk_)) {
        syms.push_back(unk_);
      }
    }
    i += n;
  }
  if (syms.size() < 2) {
    out->insert(out->end(), syms.begin(), syms.end());
    return;
  }
  // Merge the lowest-ranked adjacent pair, the leftmost among equals, until none is left: a
  // heap of candidate pairs over a linked list of symbols, O(n log n) for a long word.
  struct Sym {
    int32_t id;
    int32_t prev, next;  // -1 at the ends
  };
  std::vector<Sym> list(syms.size());
  for (size_t i = 0; i < syms.size(); ++i) {
    list[i] = {syms[i], static_cast<int32_t>(i) - 1,
               i + 1 < syms.size() ? static_cast<int32_t>(i) + 1 : -1};
  }
  struct Cand {
    int32_t rank, pos, left, right;  // pos: the left symbol; left/right: the ids when queued
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || list[pos].next < 0) return;
    const int32_t l = list[pos].id, r = list[list[pos].next].id;
    auto it = merges_.find((static_cast<uint64_t>(l) << 32) | static_cast<uint32_t>(r));
    if (it != merges_.end()) heap.push({it->second.rank, pos, l, r});
  };
  for (size_t i = 0; i + 1 < list.size(); ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& left = list[c.pos];
    if (left.id != c.left || left.next < 0 || list[left.next].id != c.right) continue;  // stale
    const int32_t gone = left.next;
    left.id = merges_.at((static_cast<uint64_t>(c.left) << 32) | static_cast<uint32_t>(c.right)).id;
    left.next = list[gone].next;
    if (left.next >= 0) list[left.next].prev = c.pos;
    list[gone].id = -1;  // removed
    push(left.prev);
    push(c.pos);
  }
  syms.clear();
  for (int32_t i = 0; i >= 0; i = list[i].next) syms.push_back(list[i].id);
  out->insert(out->end(), syms.begin(), syms.end());
}

}  // namespace moeserve
