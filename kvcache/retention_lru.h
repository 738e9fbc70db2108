// An index of values by key kept in recency order, where an entry may be retained until a
// deadline: what the host DDR tier and the flash store of the KV cache push out by. The next
// victim is the least recently used entry whose deadline has passed, else (where allowed) the
// least recently used of all. Not thread-safe: its owners lock.
//
// The device block pool keeps its own lists: it evicts on every allocation, so its retained
// blocks live on a list of their own (O(1) eviction, no scan past them), expired ones go to the
// eviction end, and every list is per expert-parallel segment (block_pool.h).
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace moeserve {

template <typename Key, typename Value, typename Hasher = std::hash<Key>>
class RetentionLru {
 public:
  struct Entry {
    Value value;
    double retain_until = 0;  // 0: an ordinary entry
  };

  RetentionLru() = default;
  // Not copyable: the index holds positions in the order list.
  RetentionLru(const RetentionLru&) = delete;
  RetentionLru& operator=(const RetentionLru&) = delete;

  size_t size() const { return index_.size(); }
  bool empty() const { return index_.empty(); }
  bool Contains(const Key& key) const { return index_.count(key) > 0; }

  // Adds `key` as the most recently used (or the least, `newest` false: rebuilding an index
  // from oldest-last lists). A key already present is replaced.
  Entry& Put(const Key& key, Value value, double retain_until, bool newest = true) {
    Erase(key);
    order_.insert(newest ? order_.begin() : order_.end(), key);
    Node& n = index_[key];
    n.entry = Entry{std::move(value), retain_until};
    n.pos = newest ? order_.begin() : std::prev(order_.end());
    return n.entry;
  }

  // The entry, or nullptr; `touch` makes it the most recently used.
  Entry* Find(const Key& key, bool touch) {
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    if (touch) order_.splice(order_.begin(), order_, it->second.pos);
    return &it->second.entry;
  }
  const Entry* Find(const Key& key) const {
    auto it = index_.find(key);
    return it == index_.end() ? nullptr : &it->second.entry;
  }

  // Removes `key`; its entry, or nothing if it was absent.
  std::optional<Entry> Take(const Key& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return std::nullopt;
    std::optional<Entry> e(std::move(it->second.entry));
    order_.erase(it->second.pos);
    index_.erase(it);
    return e;
  }
  bool Erase(const Key& key) { return Take(key).has_value(); }

  // The entry to push out at time `now`: the least recently used whose deadline is not after
  // `now`, else, with `may_take_retained`, the least recently used; nothing when none may go.
  std::optional<Key> Victim(double now, bool may_take_retained) const {
    const std::vector<Key> first = Victims(now, may_take_retained, [](const Entry&) { return true; });
    if (first.empty()) return std::nullopt;
    return first.front();
  }

  // The entries to push out at `now`, in the order Victim would name them one after another,
  // until `enough(entry)` (called on each in turn) says the room is made: one pass over the
  // expired entries, least recently used first, then (with `may_take_retained`) one over the
  // retained ones. The caller erases them.
  template <typename Enough>
  std::vector<Key> Victims(double now, bool may_take_retained, Enough&& enough) const {
    std::vector<Key> out;
    for (int retained = 0; retained < (may_take_retained ? 2 : 1); ++retained) {
      for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
        const Entry& e = index_.at(*it).entry;
        if ((e.retain_until > now) != (retained == 1)) continue;
        out.push_back(*it);
        if (enough(e)) return out;
      }
    }
    return out;
  }

  // Entries whose deadline is after `now`.
  int64_t Retained(double now) const {
    int64_t n = 0;
    for (const auto& [key, node] : index_) n += node.entry.retain_until > now;
    return n;
  }

 private:
  struct Node {
    Entry entry;
    typename std::list<Key>::iterator pos;  // in order_
  };
  std::unordered_map<Key, Node, Hasher> index_;
  std::list<Key> order_;  // front: most recently used
};

}  // namespace moeserve
