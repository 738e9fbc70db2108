// Replicated experts across scale-up domains: the placement puts an expert's copies in distinct
// domains (parallel/placement.h), a sender's rows go to its own domain's copy (NearHolders), and
// ExpectedTraffic (parallel/routed_traffic.h) says where the routed rows travel, checked
// against closed forms and against a count over every sender, expert and holder by the rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <tuple>

#include "parallel/placement.h"
#include "parallel/routed_traffic.h"

namespace moeserve {
namespace {

ExpertLoad SkewedLoad(std::mt19937& gen, int64_t layers, int64_t experts) {
  ExpertLoad load{layers, experts, {}};
  std::lognormal_distribution<double> skew(0.0, 1.5);
  for (int64_t i = 0; i < layers * experts; ++i) load.tokens.push_back(1 + static_cast<int64_t>(100 * skew(gen)));
  return load;
}

TEST(NearHoldersTest, TheSendersDomainFirst) {
  EXPECT_EQ(NearHolders({0, 2, 5}, 3, 2), (std::vector<int32_t>{2}));   // domain 1 holds rank 2's copy
  EXPECT_EQ(NearHolders({0, 1, 5}, 1, 2), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(NearHolders({0, 5}, 3, 2), (std::vector<int32_t>{0, 5}));    // none in domain 1: all
  EXPECT_EQ(NearHolders({0, 2, 5}, 3, 0), (std::vector<int32_t>{0, 2, 5}));  // one domain
  EXPECT_EQ(NearHolders({4}, 0, 2), (std::vector<int32_t>{4}));
}

// On fresh random loads: copies in distinct domains, every rank's room filled, E + R copies, and
// the most replicas the domains allow accepted (every expert then in every domain).
TEST(DomainCopiesTest, AnExpertsCopiesSitInDistinctDomains) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  for (const auto& [experts, ep, domain] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {8, 4, 2}, {8, 4, 1}, {16, 8, 2}, {16, 8, 4}, {12, 6, 3}, {9, 3, 1}}) {
    const int64_t domains = ep / domain, most = MaxReplicas(experts, ep, domain);
    EXPECT_EQ(most, experts * (domains - 1));
    const ExpertLoad load = SkewedLoad(gen, 3, experts);
    for (int64_t replicas = 1; replicas <= most; ++replicas) {
      if ((experts + replicas) % ep != 0) continue;
      SCOPED_TRACE(::testing::Message() << experts << " experts, ep " << ep << ", domains of " << domain << ", "
                                        << replicas << " replicas");
      const ExpertHolderTable h = ExpertHolders(load.layers, experts, ep, ExpertPlacement::kBalanced, &load, replicas, domain);
      for (const auto& layer : h) {
        std::vector<int64_t> held(static_cast<size_t>(ep), 0);
        int64_t copies = 0;
        for (const auto& holders : layer) {
          std::vector<int64_t> in(static_cast<size_t>(domains), 0);
          for (int32_t r : holders) ++in[static_cast<size_t>(r / domain)], ++held[static_cast<size_t>(r)];
          EXPECT_LE(*std::max_element(in.begin(), in.end()), 1) << "two copies of an expert in one domain";
          copies += static_cast<int64_t>(holders.size());
          if (replicas == most) {
            EXPECT_EQ(holders.size(), static_cast<size_t>(domains)) << "the most replicas: every expert in every domain";
          }
        }
        EXPECT_EQ(copies, experts + replicas);
        EXPECT_EQ(held, std::vector<int64_t>(static_cast<size_t>(ep), (experts + replicas) / ep));
      }
    }
  }
}

// A layer where EPLB's rule gets stuck (6 ranks in domains of 3, 8 experts, 4 copies): the copies
// in order of load per copy are e2, e3, e5, e7 e7, e1 e1, e0 e0, e6 e6, e4 (e7, e1, e0, e6 take the
// copies); dealt round robin over the ranks 0, 3, 1, 4, 2, 5 (the domains alternating), an
// expert's two copies land in different domains. That deal leaves the busiest rank lighter than
// the copies added to the balanced placement, so it is the one kept.
TEST(DomainCopiesTest, WhereTheRuleIsStuckTheDealKeepsCopiesApart) {
  const ExpertLoad load{1, 8, {73, 91, 64, 51, 2, 50, 71, 93}};
  using L = std::vector<std::vector<int32_t>>;
  EXPECT_EQ(ExpertHolders(1, 8, 6, ExpertPlacement::kBalanced, &load, 4, 3)[0],
            (L{{1, 3}, {0, 5}, {0}, {3}, {5}, {1}, {2, 4}, {2, 4}}));
}

// The traffic by the rule, counted over every sender q (1 / ep of the tokens), expert (its
// share) and holder: the oracle ExpectedTraffic must equal.
RoutedTraffic CountedTraffic(const ExpertHolderTable& h, const ExpertLoad& load, int64_t ep, int64_t domain) {
  RoutedTraffic t;
  for (int64_t l = 0; l < load.layers; ++l) {
    double total = 0;
    for (int64_t e = 0; e < load.experts; ++e) total += static_cast<double>(load.at(l, e));
    for (int64_t e = 0; e < load.experts; ++e) {
      const auto& all = h[static_cast<size_t>(l)][static_cast<size_t>(e)];
      for (int64_t q = 0; q < ep; ++q) {
        std::vector<int32_t> mine;
        for (int32_t r : all) {
          if (r / domain == q / domain) mine.push_back(r);
        }
        const std::vector<int32_t>& to = mine.empty() ? all : mine;
        for (int32_t r : to) {
          const double part = static_cast<double>(load.at(l, e)) / total / static_cast<double>(ep) /
                              static_cast<double>(to.size()) / static_cast<double>(load.layers);
          (r == q ? t.own : r / domain == q / domain ? t.inside : t.outside) += part;
        }
      }
    }
  }
  return t;
}

TEST(RoutedTrafficTest, ClosedFormsAndTheRuleCounted) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  // One copy per expert: the uniform case, whatever the load.
  for (const auto& [ep, domain] : std::vector<std::pair<int64_t, int64_t>>{{4, 2}, {8, 2}, {8, 4}, {4, 0}, {4, 1}}) {
    const ExpertLoad load = SkewedLoad(gen, 2, 16);
    const RoutedTraffic t =
        ExpectedTraffic(ExpertHolders(2, 16, ep, ExpertPlacement::kBalanced, &load), &load, ep, domain);
    const double d = domain > 0 ? static_cast<double>(domain) : static_cast<double>(ep);
    EXPECT_NEAR(t.own, 1.0 / ep, 1e-12) << "ep " << ep << " domain " << domain;
    EXPECT_NEAR(t.inside, (d - 1) / ep, 1e-12) << "ep " << ep << " domain " << domain;
    EXPECT_NEAR(t.outside, (ep - d) / ep, 1e-12) << "ep " << ep << " domain " << domain;
  }
  // Every expert in every domain: nothing leaves a domain, and a sender holds the copy it uses
  // 1 / domain of the time.
  const ExpertLoad load = SkewedLoad(gen, 2, 8);
  const RoutedTraffic all = ExpectedTraffic(ExpertHolders(2, 8, 8, ExpertPlacement::kBalanced, &load, 24, 2), &load, 8, 2);
  EXPECT_NEAR(all.outside, 0.0, 1e-12);
  EXPECT_NEAR(all.own, 0.5, 1e-12);
  EXPECT_NEAR(all.inside, 0.5, 1e-12);
  // Some copies: the rule counted.
  for (const auto& [ep, domain, replicas] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{4, 2, 4}, {8, 2, 8}, {8, 4, 8}, {4, 1, 8}}) {
    const ExpertLoad l = SkewedLoad(gen, 3, 8);
    const ExpertHolderTable h = ExpertHolders(3, 8, ep, ExpertPlacement::kBalanced, &l, replicas, domain);
    const RoutedTraffic got = ExpectedTraffic(h, &l, ep, domain), want = CountedTraffic(h, l, ep, domain);
    EXPECT_NEAR(got.own, want.own, 1e-12) << "ep " << ep << " domain " << domain;
    EXPECT_NEAR(got.inside, want.inside, 1e-12) << "ep " << ep << " domain " << domain;
    EXPECT_NEAR(got.outside, want.outside, 1e-12) << "ep " << ep << " domain " << domain;
    EXPECT_NEAR(got.own + got.inside + got.outside, 1.0, 1e-12);
    EXPECT_LT(got.outside, static_cast<double>(ep - domain) / ep) << "copies in other domains keep rows home";
  }
}

}  // namespace
}  // namespace moeserve
