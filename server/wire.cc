// Request parsing with reasons, response serialisation.
#include "server/wire.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/unknown_field_set.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "text/tokenizer.h"

namespace moeserve::server {
namespace {

namespace pb = google::protobuf;

// Finds the first string field holding invalid UTF-8 in well-formed wire bytes of `type` (the
// one reason such bytes fail to parse as proto3); "" when there is none.
std::string FindInvalidUtf8(const pb::UnknownFieldSet& fields, const pb::Descriptor* type,
                            const std::string& prefix) {
  for (int i = 0; i < fields.field_count(); ++i) {
    const pb::UnknownField& f = fields.field(i);
    if (f.type() != pb::UnknownField::TYPE_LENGTH_DELIMITED) continue;
    const pb::FieldDescriptor* d = type->FindFieldByNumber(f.number());
    if (d == nullptr) continue;
    const std::string name = prefix + d->name();
    if (d->type() == pb::FieldDescriptor::TYPE_STRING) {
      if (auto at = FirstInvalidUtf8(f.length_delimited()); at.has_value()) {
        return absl::StrCat(name, ": invalid UTF-8 at byte ", *at, " of ",
                            f.length_delimited().size(),
                            " (send text as UTF-8, or the prompt as token_ids)");
      }
    } else if (d->type() == pb::FieldDescriptor::TYPE_MESSAGE) {
      pb::UnknownFieldSet inner;
      if (inner.ParseFromString(f.length_delimited())) {
        std::string why = FindInvalidUtf8(inner, d->message_type(), name + ".");
        if (!why.empty()) return why;
      }
    }
  }
  return "";
}

}  // namespace

absl::Status ParseRequest(const grpc::ByteBuffer& in, pb::Message* out) {
  std::vector<grpc::Slice> slices;
  if (!in.Valid() || !in.Dump(&slices).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no ", out->GetDescriptor()->full_name(), " message in the call"));
  }
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  if (out->ParseFromString(bytes)) return absl::OkStatus();
  const std::string type = out->GetDescriptor()->full_name();
  pb::UnknownFieldSet fields;
  if (fields.ParseFromString(bytes)) {
    std::string why = FindInvalidUtf8(fields, out->GetDescriptor(), "");
    if (!why.empty()) return absl::InvalidArgumentError(why);
    return absl::InvalidArgumentError(
        absl::StrCat("the request (", bytes.size(), " bytes) does not parse as ", type));
  }
  return absl::InvalidArgumentError(absl::StrCat("the request (", bytes.size(),
                                                 " bytes) is not a valid ", type,
                                                 ": malformed or truncated protobuf"));
}

void SerializeResponse(const pb::Message& msg, grpc::ByteBuffer* out) {
  const std::string bytes = msg.SerializeAsString();
  grpc::Slice slice(bytes);
  *out = grpc::ByteBuffer(&slice, 1);
}

}  // namespace moeserve::server
