// RetentionLru against a naive model of the same policy on random operation sequences: a list of
// (key, value, deadline, last use) where the victim is found by sorting on last use.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <random>
#include <vector>

#include "kvcache/retention_lru.h"

namespace moeserve {
namespace {

struct Naive {
  struct Item {
    int key, value;
    double retain_until;
    int64_t used;
  };
  std::vector<Item> items;
  int64_t clock = 0;
  Item* Find(int key) {
    for (auto& i : items) {
      if (i.key == key) return &i;
    }
    return nullptr;
  }
  void Put(int key, int value, double retain, bool newest) {
    Erase(key);
    int64_t oldest = clock;
    for (const auto& i : items) oldest = std::min(oldest, i.used);
    items.push_back({key, value, retain, newest ? ++clock : oldest - 1});
  }
  void Erase(int key) {
    items.erase(std::remove_if(items.begin(), items.end(), [&](const Item& i) { return i.key == key; }), items.end());
  }
  std::optional<int> Victim(double now, bool retained_too) const {
    std::vector<Item> by_age = items;
    std::sort(by_age.begin(), by_age.end(), [](const Item& a, const Item& b) { return a.used < b.used; });
    for (const auto& i : by_age) {
      if (i.retain_until <= now) return i.key;
    }
    if (retained_too && !by_age.empty()) return by_age.front().key;
    return std::nullopt;
  }
};

TEST(RetentionLruTest, AgreesWithANaiveModelOnRandomOperations) {
  std::random_device rd;
  const uint32_t seed = rd();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  for (int round = 0; round < 20; ++round) {
    RetentionLru<int, int> lru;
    Naive naive;
    double now = 0;
    for (int op = 0; op < 400; ++op) {
      const int key = std::uniform_int_distribution<int>(0, 24)(gen);
      const int kind = std::uniform_int_distribution<int>(0, 5)(gen);
      SCOPED_TRACE(::testing::Message() << "round " << round << " op " << op << " kind " << kind << " key " << key);
      if (kind <= 1) {  // put, sometimes retained, sometimes as the oldest
        const double retain = std::bernoulli_distribution(0.3)(gen) ? now + std::uniform_real_distribution<>(0, 5)(gen) : 0;
        const bool newest = std::bernoulli_distribution(0.9)(gen);
        lru.Put(key, op, retain, newest);
        naive.Put(key, op, retain, newest);
      } else if (kind == 2) {  // a read that uses it
        auto* e = lru.Find(key, /*touch=*/true);
        auto* n = naive.Find(key);
        ASSERT_EQ(e != nullptr, n != nullptr);
        if (n != nullptr) {
          EXPECT_EQ(e->value, n->value);
          n->used = ++naive.clock;
        }
      } else if (kind == 3) {
        const auto taken = lru.Take(key);
        auto* n = naive.Find(key);
        ASSERT_EQ(taken.has_value(), n != nullptr);
        if (n != nullptr) {
          EXPECT_EQ(taken->value, n->value);
        }
        naive.Erase(key);
      } else if (kind == 4) {
        now += std::uniform_real_distribution<>(0, 1)(gen);
      } else {  // evict one
        const bool retained_too = std::bernoulli_distribution(0.5)(gen);
        const auto got = lru.Victim(now, retained_too);
        const auto want = naive.Victim(now, retained_too);
        ASSERT_EQ(got, want);
        // The one-pass list names, one after another, what Victim names after each erase.
        const int many = std::uniform_int_distribution<int>(1, 6)(gen);
        int seen = 0;
        const auto list = lru.Victims(now, retained_too, [&](const auto&) { return ++seen == many; });
        Naive copy = naive;
        for (int key : list) {
          ASSERT_EQ(copy.Victim(now, retained_too), key);
          copy.Erase(key);
        }
        if (static_cast<int>(list.size()) < many) {
          ASSERT_FALSE(copy.Victim(now, retained_too).has_value());
        }
        if (got) {
          lru.Erase(*got);
          naive.Erase(*got);
        }
      }
      ASSERT_EQ(lru.size(), naive.items.size());
      int64_t retained = 0;
      for (const auto& i : naive.items) retained += i.retain_until > now;
      ASSERT_EQ(lru.Retained(now), retained);
    }
  }
}

}  // namespace
}  // namespace moeserve
