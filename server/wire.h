// The service's methods take and give raw bytes (gRPC's ByteBuffer), so that a request that
// does not parse gets INVALID_ARGUMENT with a message saying why (garbage, a truncated message,
// invalid UTF-8 in a string field) instead of the UNIMPLEMENTED with no message that gRPC's
// own deserialisation answers. These parse and serialise the moeserve.v1 messages.
#pragma once

#include <google/protobuf/message.h>
#include <grpcpp/support/byte_buffer.h>

#include "absl/status/status.h"

namespace moeserve::server {

// Parses `in` into `out`; on failure INVALID_ARGUMENT naming the message type and, where the
// bytes are well-formed protobuf, the string field with invalid UTF-8 and the byte offset.
absl::Status ParseRequest(const grpc::ByteBuffer& in, google::protobuf::Message* out);

// Serialises `msg` into `out` (a ByteBuffer owning one slice).
void SerializeResponse(const google::protobuf::Message& msg, grpc::ByteBuffer* out);

}  // namespace moeserve::server
