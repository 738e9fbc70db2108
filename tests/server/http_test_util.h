// Helpers of the OpenAI HTTP API tests: POST a JSON body, read an event stream's data objects,
// and a suite fixture that serves the tiny preset once for all its tests.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tests/server/grpc_client.h"

namespace moeserve::testing {

// (status, parsed body); status -1 when the request failed.
inline std::pair<int, nlohmann::json> PostTo(const ServerProcess& s, const std::string& path,
                                             const nlohmann::json& body) {
  httplib::Client c("127.0.0.1", s.http_port());
  c.set_read_timeout(60, 0);
  auto r = c.Post(path.c_str(), body.dump(), "application/json");
  if (!r) return {-1, nlohmann::json()};
  return {r->status, nlohmann::json::parse(r->body, nullptr, false)};
}

// The JSON objects of a server-sent event stream's "data: {...}" lines, in order.
inline std::vector<nlohmann::json> SseObjects(const std::string& body) {
  std::vector<nlohmann::json> out;
  for (size_t at = 0; (at = body.find("data: {", at)) != std::string::npos; ++at) {
    out.push_back(nlohmann::json::parse(body.substr(at + 6, body.find("\n\n", at) - at - 6)));
  }
  return out;
}

// A suite that serves `--preset tiny` for all its tests.
class TinyHttpTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess;
    ASSERT_TRUE(server_->Start({"--preset", "tiny"})) << server_->log();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->Stop(SIGTERM), 0) << server_->log();
    delete server_;
    server_ = nullptr;
  }
  static std::pair<int, nlohmann::json> Post(const std::string& path, const nlohmann::json& body) {
    return PostTo(*server_, path, body);
  }
  // The raw body of a POST (an event stream).
  static std::string PostRaw(const std::string& path, const nlohmann::json& body) {
    httplib::Client c("127.0.0.1", server_->http_port());
    c.set_read_timeout(60, 0);
    auto r = c.Post(path.c_str(), body.dump(), "application/json");
    EXPECT_TRUE(r) << path;
    return r ? r->body : std::string();
  }
  inline static ServerProcess* server_ = nullptr;
};

}  // namespace moeserve::testing
