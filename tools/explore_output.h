// `moeserve explore`'s output: the table of layouts, the best layout per sequences count, and
// the JSON and CSV of the layouts and of the points measured with --measure.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "roofline/hardware.h"
#include "roofline/layout_search.h"
#include "tools/explore_measure.h"

namespace moeserve::tools {

using Json = nlohmann::json;

// Per sequences count, the layout with the most tokens/s among those that fit (null: none fits).
using BestLayouts = std::vector<std::pair<int64_t, const roofline::LayoutCandidate*>>;
BestLayouts Best(const std::vector<roofline::LayoutCandidate>& all, const std::vector<int64_t>& sequences);

// The table of every layout and point, the best per sequences count marked. `routing` names
// the routing the imbalances come from.
void PrintLayouts(const roofline::LayoutSearch& s, const std::vector<roofline::LayoutCandidate>& all,
                  const BestLayouts& best, const std::string& dtype, const std::string& routing);
// Predicted beside measured, each layout as it ran here.
void PrintMeasured(const std::vector<MeasuredPoint>& measured, const roofline::HardwareProfile& hw);

Json ToJson(const roofline::LayoutSearch& s, const std::vector<roofline::LayoutCandidate>& all,
            const BestLayouts& best);
Json MeasuredJson(const std::vector<MeasuredPoint>& measured);
// One row per layout and sequences count.
void WriteCsv(const std::string& path, const std::vector<roofline::LayoutCandidate>& all);
// One row per measured point (the columns of MeasuredJson).
absl::Status WriteMeasuredCsv(const std::string& path, const std::vector<MeasuredPoint>& measured);

}  // namespace moeserve::tools
