// The sentencepiece module: a small shared object, loaded by sp_processor.cc with dlopen
// (RTLD_LOCAL | RTLD_DEEPBIND). Debian's libsentencepiece carries its own copy of protobuf-lite
// with exported symbols; linked into the server beside gRPC's libprotobuf, the two copies
// resolve into each other and the process crashes at start-up. Loaded this way, sentencepiece
// binds to its own copy and nothing of it enters the global symbol scope. Only a C interface
// crosses the boundary; no abseil here (see sp_processor.h).
#include <sentencepiece_processor.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

void CopyError(const std::string& s, char* err, size_t len) {
  if (len == 0) return;
  std::strncpy(err, s.c_str(), len - 1);
  err[len - 1] = '\0';
}

sentencepiece::SentencePieceProcessor* Sp(void* p) {
  return static_cast<sentencepiece::SentencePieceProcessor*>(p);
}

}  // namespace

extern "C" {

void* moeserve_sp_load(const char* path, char* err, size_t err_len) {
  auto* sp = new sentencepiece::SentencePieceProcessor();
  const auto status = sp->Load(path);
  if (!status.ok()) {
    CopyError(status.ToString(), err, err_len);
    delete sp;
    return nullptr;
  }
  return sp;
}

void moeserve_sp_free(void* sp) { delete Sp(sp); }

// Fills *ids (malloc'd, freed by the caller with free) and *n; 0 on success.
int moeserve_sp_encode(void* sp, const char* text, size_t len, int** ids, size_t* n, char* err,
                       size_t err_len) {
  std::vector<int> out;
  const auto status = Sp(sp)->Encode(std::string_view(text, len), &out);
  if (!status.ok()) {
    CopyError(status.ToString(), err, err_len);
    return 1;
  }
  *n = out.size();
  *ids = static_cast<int*>(std::malloc(sizeof(int) * (out.size() + 1)));
  std::memcpy(*ids, out.data(), sizeof(int) * out.size());
  return 0;
}

// The decoded text, malloc'd (freed by the caller), with its length in *len.
char* moeserve_sp_decode(void* sp, const int* ids, size_t n, size_t* len) {
  std::string text;
  if (!Sp(sp)->Decode(std::vector<int>(ids, ids + n), &text).ok()) text.clear();
  *len = text.size();
  char* out = static_cast<char*>(std::malloc(text.size() + 1));
  std::memcpy(out, text.data(), text.size());
  return out;
}

// The piece's bytes, malloc'd (freed by the caller), with its length in *len.
char* moeserve_sp_id_to_piece(void* sp, int id, size_t* len) {
  const std::string& piece = Sp(sp)->IdToPiece(id);
  *len = piece.size();
  char* out = static_cast<char*>(std::malloc(piece.size() + 1));
  std::memcpy(out, piece.data(), piece.size());
  return out;
}

int moeserve_sp_piece_to_id(void* sp, const char* piece, size_t len) {
  return Sp(sp)->PieceToId(std::string_view(piece, len));
}
int moeserve_sp_size(void* sp) { return Sp(sp)->GetPieceSize(); }
int moeserve_sp_is_control(void* sp, int id) { return Sp(sp)->IsControl(id); }
int moeserve_sp_is_unknown(void* sp, int id) { return Sp(sp)->IsUnknown(id); }
int moeserve_sp_bos_id(void* sp) { return Sp(sp)->bos_id(); }
int moeserve_sp_eos_id(void* sp) { return Sp(sp)->eos_id(); }

}  // extern "C"
