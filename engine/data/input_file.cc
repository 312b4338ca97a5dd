// Plain, gzip and zstd input files as lines; see input_file.h.
#include "engine/data/input_file.h"

#include <zlib.h>
#include <zstd.h>

#include <cerrno>
#include <cstring>

namespace switchyard::data {
namespace {

constexpr size_t kPieceBytes = size_t{1} << 20;

const char kBinaryHint[] =
    "; prep reads UTF-8 text or JSONL files, plain, gzip- or zstd-compressed";

}  // namespace

struct InputFile::Decoder {
  z_stream zlib{};
  bool zlib_ready = false;
  ZSTD_DStream* zstd = nullptr;
  bool in_frame = false;  // a member/frame has started and not ended

  ~Decoder() {
    if (zlib_ready) inflateEnd(&zlib);
    if (zstd != nullptr) ZSTD_freeDStream(zstd);
  }
};

const char* CompressionName(Compression compression) {
  switch (compression) {
    case Compression::kGzip:
      return "gzip";
    case Compression::kZstd:
      return "zstd";
    default:
      return "plain";
  }
}

InputFile::InputFile(std::string path) : path_(std::move(path)) {}

InputFile::~InputFile() {
  if (file_ != nullptr) std::fclose(file_);
}

StatusOr<std::unique_ptr<InputFile>> InputFile::Open(const std::string& path) {
  std::unique_ptr<InputFile> in(new InputFile(path));
  in->file_ = std::fopen(path.c_str(), "rb");
  if (in->file_ == nullptr) {
    return NotFound(path, ": cannot open for reading (", std::strerror(errno), ")");
  }
  SY_RETURN_IF_ERROR(in->ReadRaw().status());
  const auto* head = reinterpret_cast<const unsigned char*>(in->raw_.data());
  const size_t n = in->raw_.size();
  if (n >= 2 && head[0] == 0x1f && head[1] == 0x8b) {
    in->compression_ = Compression::kGzip;
  } else if (n >= 4 && head[0] == 0x28 && head[1] == 0xb5 && head[2] == 0x2f &&
             head[3] == 0xfd) {
    in->compression_ = Compression::kZstd;
  }
  in->decoder_ = std::make_unique<Decoder>();
  if (in->compression_ == Compression::kGzip) {
    // 15 + 16: gzip framing only.
    if (inflateInit2(&in->decoder_->zlib, 15 + 16) != Z_OK) {
      return Internal(path, ": cannot start the gzip decoder");
    }
    in->decoder_->zlib_ready = true;
  } else if (in->compression_ == Compression::kZstd) {
    in->decoder_->zstd = ZSTD_createDStream();
    if (in->decoder_->zstd == nullptr || ZSTD_isError(ZSTD_initDStream(in->decoder_->zstd))) {
      return Internal(path, ": cannot start the zstd decoder");
    }
  }
  return in;
}

StatusOr<bool> InputFile::ReadRaw() {
  if (raw_pos_ > 0) {
    raw_offset_ += raw_pos_;
    raw_.erase(0, raw_pos_);
    raw_pos_ = 0;
  }
  if (raw_end_) return false;
  const size_t old = raw_.size();
  raw_.resize(old + kPieceBytes);
  const size_t got = std::fread(raw_.data() + old, 1, kPieceBytes, file_);
  raw_.resize(old + got);
  if (got < kPieceBytes) {
    if (std::ferror(file_)) return DataLoss(path_, ": read failed (", std::strerror(errno), ")");
    raw_end_ = true;
  }
  return got > 0;
}

StatusOr<bool> InputFile::Fill() {
  text_offset_ += text_.size();
  text_.clear();
  text_pos_ = 0;
  if (text_end_) return false;
  Decoder& d = *decoder_;
  while (text_.empty()) {
    if (raw_pos_ == raw_.size()) {
      SY_ASSIGN_OR_RETURN(bool more, ReadRaw());
      if (!more) {
        if (d.in_frame) {
          return DataLoss(path_, ": truncated ", CompressionName(compression_),
                          " data (the file ends inside a compressed stream, after ",
                          text_offset_, " uncompressed bytes)");
        }
        text_end_ = true;
        return false;
      }
    }
    const size_t available = raw_.size() - raw_pos_;
    if (compression_ == Compression::kNone) {
      text_.assign(raw_, raw_pos_, available);
      raw_pos_ = raw_.size();
      break;
    }
    text_.resize(kPieceBytes);
    size_t produced = 0, consumed = 0;
    if (compression_ == Compression::kGzip) {
      z_stream& z = d.zlib;
      z.next_in = reinterpret_cast<Bytef*>(raw_.data() + raw_pos_);
      z.avail_in = static_cast<uInt>(available);
      z.next_out = reinterpret_cast<Bytef*>(text_.data());
      z.avail_out = static_cast<uInt>(text_.size());
      const int ret = inflate(&z, Z_NO_FLUSH);
      consumed = available - z.avail_in;
      produced = text_.size() - z.avail_out;
      if (ret == Z_STREAM_END) {
        d.in_frame = false;
        inflateReset(&z);
      } else if (ret == Z_OK || ret == Z_BUF_ERROR) {
        d.in_frame = true;
      } else {
        return DataLoss(path_, ": corrupt gzip data (", z.msg != nullptr ? z.msg : "error",
                        ", found by byte ", raw_offset_ + raw_pos_ + consumed, " of the file, after ",
                        text_offset_ + produced, " uncompressed bytes)");
      }
    } else {
      ZSTD_inBuffer in{raw_.data() + raw_pos_, available, 0};
      ZSTD_outBuffer out{text_.data(), text_.size(), 0};
      const size_t ret = ZSTD_decompressStream(d.zstd, &out, &in);
      if (ZSTD_isError(ret)) {
        return DataLoss(path_, ": corrupt zstd data (", ZSTD_getErrorName(ret), ", found by byte ",
                        raw_offset_ + raw_pos_ + in.pos, " of the file, after ",
                        text_offset_ + out.pos, " uncompressed bytes)");
      }
      consumed = in.pos;
      produced = out.pos;
      d.in_frame = ret != 0;
    }
    raw_pos_ += consumed;
    text_.resize(produced);
  }
  if (const void* nul = std::memchr(text_.data(), 0, text_.size()); nul != nullptr) {
    const uint64_t at = text_offset_ + (static_cast<const char*>(nul) - text_.data());
    return DataLoss(path_, ": binary data (a NUL byte at uncompressed offset ", at, ")",
                    kBinaryHint);
  }
  return true;
}

StatusOr<bool> InputFile::ReadLine(std::string* line) {
  line->clear();
  bool any = false;
  while (true) {
    if (text_pos_ == text_.size()) {
      SY_ASSIGN_OR_RETURN(bool more, Fill());
      if (!more) break;
    }
    any = true;
    const char* begin = text_.data() + text_pos_;
    const size_t left = text_.size() - text_pos_;
    const void* newline = std::memchr(begin, '\n', left);
    if (newline != nullptr) {
      const size_t n = static_cast<const char*>(newline) - begin;
      line->append(begin, n);
      text_pos_ += n + 1;
      bytes_read_ += n + 1;
      ++line_number_;
      return true;
    }
    line->append(begin, left);
    text_pos_ = text_.size();
    bytes_read_ += left;
  }
  if (!any) return false;
  ++line_number_;
  return true;
}

}  // namespace switchyard::data
