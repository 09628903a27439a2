// Host side of the elementwise kernels: the strided layouts of broadcasting and of sum_to (computed
// once per node when a plan is prepared), the workspace size of sum_to, and dropout's stream key.
#include <string>

#include "backends/cuda/cuda_kernels.hpp"
#include "backends/cuda/elementwise_kernels.hpp"
#include "treadle/error.hpp"

namespace treadle::cuda {
namespace {

std::string dims_str(const std::vector<int64_t>& s) {
  std::string out = "(";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

// Strides (in elements) of the contiguous tensor `in` seen with out's rank, right-aligned; 0 along
// the dimensions where `in` is 1 or absent. ValueError where `in` does not broadcast to `out`.
std::vector<int64_t> broadcast_strides(const char* fn, const std::vector<int64_t>& in,
                                       const std::vector<int64_t>& out) {
  if (in.size() > out.size())
    throw_value_error(fn, ": shape ", dims_str(in), " has more dimensions than ", dims_str(out));
  std::vector<int64_t> s(out.size(), 0);
  int64_t stride = 1;
  const std::size_t lead = out.size() - in.size();
  for (std::size_t i = in.size(); i-- > 0;) {
    if (in[i] != 1 && in[i] != out[lead + i])
      throw_value_error(fn, ": shape ", dims_str(in), " does not broadcast to ", dims_str(out));
    s[lead + i] = in[i] == 1 ? 0 : stride;
    stride *= in[i];
  }
  return s;
}

}  // namespace

bool broadcast_layout(const std::vector<int64_t>& a, const std::vector<int64_t>& b, const std::vector<int64_t>& out,
                      StridedLayout& layout) {
  const std::vector<int64_t> sa = broadcast_strides("broadcast_layout", a, out);
  const std::vector<int64_t> sb = broadcast_strides("broadcast_layout", b, out);
  StridedLayout l;
  for (std::size_t d = 0; d < out.size(); ++d) {
    if (out[d] == 1) continue;  // visits one element: no index, no stride
    const int last = l.ndim - 1;
    // The previous (outer) dimension continues this one for both operands: offset = j * inner stride.
    if (last >= 0 && l.stride_a[last] == sa[d] * out[d] && l.stride_b[last] == sb[d] * out[d]) {
      l.dims[last] *= out[d];
      l.stride_a[last] = sa[d];
      l.stride_b[last] = sb[d];
      continue;
    }
    if (l.ndim == kMaxLayoutDims) return false;
    l.dims[l.ndim] = out[d];
    l.stride_a[l.ndim] = sa[d];
    l.stride_b[l.ndim] = sb[d];
    ++l.ndim;
  }
  layout = l;
  return true;
}

bool sum_to_layout(const std::vector<int64_t>& x, const std::vector<int64_t>& target, SumToLayout& layout) {
  // x walked in its own order ("a": contiguous) against the output's strides ("b": 0 where summed);
  // merging joins neighbours that are both kept or both summed.
  StridedLayout walk;
  if (!broadcast_layout(x, target, x, walk)) return false;
  SumToLayout l;
  for (int d = 0; d < walk.ndim; ++d) {
    if (walk.stride_b[d] != 0) {
      l.kept_dims[l.kept_ndim] = walk.dims[d];
      l.kept_strides[l.kept_ndim] = walk.stride_a[d];
      l.outputs *= walk.dims[d];
      ++l.kept_ndim;
    } else {
      l.reduced_dims[l.reduced_ndim] = walk.dims[d];
      l.reduced_strides[l.reduced_ndim] = walk.stride_a[d];
      l.reduced *= walk.dims[d];
      ++l.reduced_ndim;
    }
  }
  layout = l;
  return true;
}

std::size_t sum_to_workspace_bytes(const SumToLayout& layout) {
  return layout.columns() ? column_sum_workspace_bytes(layout.reduced, layout.outputs) : 0;
}

// The reference's key: splitmix64's mix of the seed, the counter and the node's stream in turn.
uint64_t dropout_key(uint64_t seed, uint64_t counter, uint64_t stream) {
  constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
  auto mix64 = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  uint64_t k = mix64(seed + kGolden);
  k = mix64(k ^ mix64(counter + 2 * kGolden));
  return mix64(k ^ mix64(stream + 3 * kGolden));
}

}  // namespace treadle::cuda
