#include "engine/checkpoint/piece.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <sstream>

#include "engine/core/check.h"

namespace switchyard::checkpoint {
namespace {

// The boxes' intersection: per dim [lo, lo + n). False when it is empty.
bool Intersect(const Piece& a, const Piece& b, std::vector<int64_t>& lo, std::vector<int64_t>& n) {
  const size_t nd = a.box.size();
  lo.resize(nd);
  n.resize(nd);
  for (size_t d = 0; d < nd; ++d) {
    lo[d] = std::max(a.offset[d], b.offset[d]);
    const int64_t hi = std::min(a.offset[d] + a.box[d], b.offset[d] + b.box[d]);
    if (hi <= lo[d]) return false;
    n[d] = hi - lo[d];
  }
  return true;
}

// How many elements of the box [lo, lo + n) (inside p's box) come before element t of p's
// box in row-major order: the elements x of the intersection with x <_lex q, where q is
// element t's place, counted dim by dim (those smaller on dim d with q's prefix before it).
int64_t CountBefore(const std::vector<int64_t>& lo, const std::vector<int64_t>& n, const Piece& p,
                    int64_t t) {
  const int nd = static_cast<int>(n.size());
  const int64_t total = NumElements(n);
  if (t <= 0) return 0;
  if (t >= NumElements(p.box)) return total;
  std::vector<int64_t> q(nd);
  for (int d = nd - 1; d >= 0; --d) {
    q[d] = t % p.box[d] + p.offset[d];
    t /= p.box[d];
  }
  int64_t count = 0, inner = total;
  for (int d = 0; d < nd; ++d) {
    inner /= n[d];
    count += std::clamp<int64_t>(q[d] - lo[d], 0, n[d]) * inner;
    if (q[d] < lo[d] || q[d] >= lo[d] + n[d]) break;  // no element shares q's prefix further
  }
  return count;
}

// Element (lo + idx) of the tensor as an index into p's data (counted from p.begin).
int64_t AtIn(const Piece& p, const std::vector<int64_t>& lo, const std::vector<int64_t>& idx) {
  int64_t at = 0;
  for (size_t d = 0; d < idx.size(); ++d) at = at * p.box[d] + lo[d] + idx[d] - p.offset[d];
  return at - p.begin;
}

// The stretch [first, last) of the intersection's row-major order that both pieces hold.
bool CommonStretch(const Piece& a, const Piece& b, std::vector<int64_t>& lo,
                   std::vector<int64_t>& n, int64_t& first, int64_t& last) {
  if (a.numel() <= 0 || b.numel() <= 0 || !Intersect(a, b, lo, n)) return false;
  first = std::max(CountBefore(lo, n, a, a.begin), CountBefore(lo, n, b, b.begin));
  last = std::min(CountBefore(lo, n, a, a.end), CountBefore(lo, n, b, b.end));
  return first < last;
}

}  // namespace

Piece BoxPiece(std::vector<int64_t> offset, Shape box) {
  const int64_t n = NumElements(box);
  return {std::move(offset), std::move(box), 0, n};
}

std::string PieceString(const Piece& p, const Shape& global) {
  std::ostringstream out;
  const bool whole_tensor = p.box == global &&
                            std::all_of(p.offset.begin(), p.offset.end(), [](int64_t o) { return o == 0; });
  if (whole_tensor) {
    out << "the whole tensor";
  } else {
    out << "box " << ShapeString(p.box) << " at [";
    for (size_t d = 0; d < p.offset.size(); ++d) out << (d ? ", " : "") << p.offset[d];
    out << "]";
  }
  if (!p.whole_box()) out << ", elements [" << p.begin << ", " << p.end << ")";
  return out.str();
}

bool PieceInside(const Piece& p, const Shape& global) {
  if (p.offset.size() != global.size() || p.box.size() != global.size()) return false;
  for (size_t d = 0; d < global.size(); ++d) {
    if (p.offset[d] < 0 || p.box[d] < 0 || p.offset[d] > global[d] - p.box[d]) return false;
  }
  return 0 <= p.begin && p.begin <= p.end && p.end <= NumElements(p.box);
}

void ForEachCommonRun(const Piece& src, const Piece& dst,
                      absl::FunctionRef<void(int64_t, int64_t, int64_t)> run) {
  SY_CHECK_EQ(src.box.size(), dst.box.size()) << "pieces of tensors of different ranks";
  if (src.box.empty()) {  // a 0-d tensor: its one element, if both hold it
    if (src.begin <= 0 && 0 < src.end && dst.begin <= 0 && 0 < dst.end) run(0, 0, 1);
    return;
  }
  std::vector<int64_t> lo, n;
  int64_t pos = 0, last = 0;
  if (!CommonStretch(src, dst, lo, n, pos, last)) return;
  const int nd = static_cast<int>(n.size());
  std::vector<int64_t> idx(nd);
  for (int64_t d = nd - 1, rest = pos; d >= 0; --d) {
    idx[d] = rest % n[d];
    rest /= n[d];
  }
  int64_t ps = 0, pd = 0, pn = 0;  // the run being extended
  while (pos < last) {
    const int64_t len = std::min(n[nd - 1] - idx[nd - 1], last - pos);
    const int64_t s = AtIn(src, lo, idx), t = AtIn(dst, lo, idx);
    if (pn > 0 && s == ps + pn && t == pd + pn) {
      pn += len;
    } else {
      if (pn > 0) run(ps, pd, pn);
      ps = s, pd = t, pn = len;
    }
    pos += len;
    idx[nd - 1] += len;
    for (int d = nd - 1; d > 0 && idx[d] == n[d]; --d) {
      idx[d] = 0;
      ++idx[d - 1];
    }
  }
  if (pn > 0) run(ps, pd, pn);
}

int64_t CommonElements(const Piece& a, const Piece& b) {
  if (a.box.empty()) return a.begin <= 0 && 0 < a.end && b.begin <= 0 && 0 < b.end ? 1 : 0;
  std::vector<int64_t> lo, n;
  int64_t first = 0, last = 0;
  return CommonStretch(a, b, lo, n, first, last) ? last - first : 0;
}

int64_t CopyCommon(const Piece& src, const void* src_data, const Piece& dst, void* dst_data,
                   size_t elem_size) {
  const char* from = static_cast<const char*>(src_data);
  char* to = static_cast<char*>(dst_data);
  int64_t copied = 0;
  ForEachCommonRun(src, dst, [&](int64_t s, int64_t d, int64_t n) {
    std::memcpy(to + d * elem_size, from + s * elem_size, static_cast<size_t>(n) * elem_size);
    copied += n;
  });
  return copied;
}

int64_t GlobalIndexOf(const Piece& p, const Shape& global, int64_t k) {
  const int nd = static_cast<int>(global.size());
  std::vector<int64_t> idx(nd);
  for (int d = nd - 1; d >= 0; --d) {
    idx[d] = k % p.box[d];
    k /= p.box[d];
  }
  int64_t g = 0;
  for (int d = 0; d < nd; ++d) g = g * global[d] + idx[d] + p.offset[d];
  return g;
}

TilingProblem CheckTiling(const std::vector<Piece>& pieces, const Shape& global) {
  TilingProblem out;
  struct Span {
    int64_t first, last;  // the tensor indices of the piece's first and last element
    int index;
  };
  std::vector<Span> spans;
  for (int i = 0; i < static_cast<int>(pieces.size()); ++i) {
    const Piece& p = pieces[i];
    if (p.numel() <= 0) continue;
    out.covered += p.numel();
    spans.push_back({GlobalIndexOf(p, global, p.begin), GlobalIndexOf(p, global, p.end - 1), i});
  }
  // Tensor order is increasing along a piece's order, so two pieces can share an element
  // only when their [first, last] spans meet: sweep by first, keeping the spans still open.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.first != b.first ? a.first < b.first : a.index < b.index;
  });
  std::vector<Span> open;
  for (const Span& s : spans) {
    std::erase_if(open, [&](const Span& o) { return o.last < s.first; });
    for (const Span& o : open) {
      if (CommonElements(pieces[o.index], pieces[s.index]) > 0) {
        out.first = std::min(o.index, s.index);
        out.second = std::max(o.index, s.index);
        return out;
      }
    }
    open.push_back(s);
  }
  return out;
}

}  // namespace switchyard::checkpoint
