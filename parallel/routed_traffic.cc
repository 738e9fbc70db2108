// Expected routed traffic of a placement (see routed_traffic.h).
#include "parallel/routed_traffic.h"

#include <vector>

namespace moeserve {

RoutedTraffic ExpectedTraffic(const ExpertHolderTable& holders, const ExpertLoad* load, int64_t ep,
                              int64_t domain_size) {
  RoutedTraffic sum;
  int64_t layers = 0;
  const int64_t d = domain_size > 0 && domain_size < ep ? domain_size : ep;  // ranks per domain
  const int64_t near_domain = d < ep ? d : 0;                                   // NearHolders' argument
  for (int64_t l = 0; l < static_cast<int64_t>(holders.size()); ++l) {
    const std::vector<std::vector<int32_t>>& layer = holders[static_cast<size_t>(l)];
    const int64_t experts = static_cast<int64_t>(layer.size());
    auto weight = [&](int64_t e) { return load ? static_cast<double>(load->at(l, e)) : 1.0; };
    double total = 0;
    for (int64_t e = 0; e < experts; ++e) total += weight(e);
    if (total <= 0) continue;
    ++layers;
    for (int64_t e = 0; e < experts; ++e) {
      const double share = weight(e) / total;
      for (int64_t q = 0; q < ep; ++q) {
        const std::vector<int32_t> near = NearHolders(layer[static_cast<size_t>(e)], q, near_domain);
        const double each = share / static_cast<double>(ep) / static_cast<double>(near.size());
        for (int32_t h : near) {
          (h == q ? sum.own : h / d == q / d ? sum.inside : sum.outside) += each;
        }
      }
    }
  }
  const double n_ep = static_cast<double>(ep);
  if (layers == 0) return {1.0 / n_ep, static_cast<double>(d - 1) / n_ep, static_cast<double>(ep - d) / n_ep};
  const double n = static_cast<double>(layers);
  return {sum.own / n, sum.inside / n, sum.outside / n};
}

}  // namespace moeserve
