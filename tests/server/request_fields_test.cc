// The request fields both front ends map one way: the scheduling class's names (one table,
// engine/priority.h) reached from gRPC's enum and HTTP's strings alike.
#include <gtest/gtest.h>

#include "absl/strings/ascii.h"
#include "engine/priority.h"
#include "models/model_config.h"
#include "server/validation.h"

namespace moeserve::server {
namespace {

TEST(RequestFieldsTest, EveryGrpcPriorityMapsThroughTheOneNameTable) {
  const ModelConfig config = *PresetConfig("tiny");
  const ModelTokenizer tokenizer = ModelTokenizer::Bytes();
  const google::protobuf::EnumDescriptor* d = v1::Priority_descriptor();
  ASSERT_EQ(d->value_count(), 4);
  for (int i = 0; i < d->value_count(); ++i) {
    v1::GenerateRequest req;
    req.set_text("hi");
    req.set_priority(static_cast<v1::Priority>(d->value(i)->number()));
    TextOptions text;
    auto r = ToEngineRequest(req, config, RequestLimits(), tokenizer, &text);
    ASSERT_TRUE(r.ok()) << d->value(i)->name() << ": " << r.status();
    // PRIORITY_FAST is the class named "fast", and so on.
    EXPECT_EQ(PriorityName(r->priority), absl::AsciiStrToLower(d->value(i)->name().substr(9))) << d->value(i)->name();
  }
  v1::GenerateRequest bad;
  bad.set_text("hi");
  bad.set_priority(static_cast<v1::Priority>(42));
  TextOptions text;
  const auto r = ToEngineRequest(bad, config, RequestLimits(), tokenizer, &text);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message().rfind("priority: ", 0), 0u) << r.status();
}

TEST(RequestFieldsTest, NamesRoundTripAndUnknownOnesAreRefusedByName) {
  for (Priority p : {Priority::kFast, Priority::kHigh, Priority::kNormal, Priority::kLow}) {
    auto back = PriorityFromName(PriorityName(p));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, p);
  }
  const auto bad = PriorityFromName("urgent");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("must be fast, high, normal or low, got \"urgent\""), std::string::npos);
}

}  // namespace
}  // namespace moeserve::server
