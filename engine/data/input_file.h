// Reading one input file of `switchyard prep` as a stream of lines, whatever its
// compression: plain, gzip (RFC 1952, concatenated members allowed; zlib) or zstd
// (libzstd), recognised by their magic bytes, not by the file name. Memory stays bounded:
// the file is read in 1 MiB pieces and only the current line is kept whole.
//
// Errors name the path and say what is wrong, one line each: a file that cannot be opened
// or read, a compressed stream that is corrupt or ends early ("truncated gzip data"), and
// binary data (a NUL byte, which no UTF-8 text holds; UTF-16 text has them too).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "engine/core/status.h"

namespace switchyard::data {

// How a file is compressed.
enum class Compression { kNone, kGzip, kZstd };

// "plain", "gzip" or "zstd".
const char* CompressionName(Compression compression);

class InputFile {
 public:
  // Opens `path` and recognises its compression from its first bytes.
  static StatusOr<std::unique_ptr<InputFile>> Open(const std::string& path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  // Reads the next line into *line without its "\n" (a "\r" before it is kept). Returns
  // false at the end of the file (a last line without "\n" is still returned).
  StatusOr<bool> ReadLine(std::string* line);

  const std::string& path() const { return path_; }
  Compression compression() const { return compression_; }
  // Lines returned so far (the number of the last one, counting from 1).
  uint64_t line_number() const { return line_number_; }
  // Uncompressed bytes returned so far (lines and their "\n").
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  struct Decoder;
  explicit InputFile(std::string path);
  // Refills text_ with the next piece of uncompressed text; false at the end.
  StatusOr<bool> Fill();
  // Reads raw bytes into raw_; false at the end of the file.
  StatusOr<bool> ReadRaw();

  std::string path_;
  Compression compression_ = Compression::kNone;
  std::FILE* file_ = nullptr;
  std::unique_ptr<Decoder> decoder_;
  std::string raw_;       // compressed bytes not consumed yet: raw_[raw_pos_ ..]
  size_t raw_pos_ = 0;
  uint64_t raw_offset_ = 0;  // file offset of raw_[0], for error messages
  bool raw_end_ = false;  // the file has no more bytes
  std::string text_;      // uncompressed bytes not returned yet: text_[text_pos_ ..]
  size_t text_pos_ = 0;
  bool text_end_ = false;
  uint64_t text_offset_ = 0;  // uncompressed offset of text_[0], for error messages
  uint64_t line_number_ = 0;
  uint64_t bytes_read_ = 0;
};

}  // namespace switchyard::data
