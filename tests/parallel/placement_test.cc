// Where a layout's pieces go: the scale-up domain read from the ranks' hosts.
#include "parallel/placement.h"

#include <gtest/gtest.h>

namespace moeserve {
namespace {

// Ranks fill hosts in order (mpirun over a hostfile's slots): equal contiguous runs give the
// domain size, one host gives 0 (one domain), anything else has no size.
TEST(DomainSizeOfHostsTest, EqualContiguousRunsOfRanksPerHost) {
  EXPECT_EQ(DomainSizeOfHosts({"a", "a", "b", "b"}), 2);
  EXPECT_EQ(DomainSizeOfHosts({"a", "b", "c", "d"}), 1);
  EXPECT_EQ(DomainSizeOfHosts({"a", "a", "a", "b", "b", "b"}), 3);
  EXPECT_EQ(DomainSizeOfHosts({"a", "a", "a", "a"}), 0);
  EXPECT_EQ(DomainSizeOfHosts({"a"}), 0);
  EXPECT_EQ(DomainSizeOfHosts({}), 0);
  EXPECT_EQ(DomainSizeOfHosts({"a", "a", "b"}), -1) << "uneven runs";
  EXPECT_EQ(DomainSizeOfHosts({"a", "b", "a", "b"}), -1) << "a host's ranks not contiguous";
  EXPECT_EQ(DomainSizeOfHosts({"a", "b", "b", "a"}), -1) << "a host's ranks not contiguous";
}

}  // namespace
}  // namespace moeserve
