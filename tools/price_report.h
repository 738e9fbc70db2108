// The price sheet as text, JSON and CSV, and a predicted sheet against a measured one.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "roofline/pricing.h"

namespace moeserve::tools {

nlohmann::json PriceSheetToJson(const roofline::PriceSheet& s, const roofline::PriceInputs& in);
// The context curve and the fast-mode curve, one row per point, `kind` naming the curve.
std::string PriceCurvesCsv(const roofline::PriceSheet& s, const std::string& source);
void PrintPriceSheet(const roofline::PriceSheet& s, const roofline::PriceInputs& in, const std::string& title);

// The fast lane under load (MeasureFastLane's JSON) beside the sheet's fast-mode point at the
// lane's batch cap.
void PrintFastLane(const nlohmann::json& lane, const roofline::PriceSheet& sheet);

// Each headline figure of both sheets and measured / predicted - 1.
nlohmann::json ComparePriceSheets(const roofline::PriceSheet& predicted, const roofline::PriceSheet& measured);
void PrintComparison(const nlohmann::json& comparison);

}  // namespace moeserve::tools
