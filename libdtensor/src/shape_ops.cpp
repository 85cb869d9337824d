#include "dtensor/api/shape_ops.h"

#include <functional>
#include <optional>

#include "dtensor/api/autograd.h"
#include "autograd_engine.h"

namespace dtensor {
namespace {

/// The local shard of a factory's tensor on this rank: `fill` writes the
/// values of the box; a Partial(sum) mesh dim keeps them on coordinate 0
/// only (zeros elsewhere), other Partials copy them.
DTensor make(const Shape& shape, const DeviceMesh& mesh, const Layout& layout, DType dtype, std::string_view what,
             const std::function<void(Tensor&, const Box&)>& fill) {
  check_shape(shape, what);
  const Layout l = validate_layout(layout, mesh.shape(), shape);
  const Box box = local_box(mesh.shape(), shape, l, mesh.coordinate());
  Tensor local = Tensor::empty(box.size, dtype, mesh.device());
  bool zero = false;
  for (int m = 0; m < l.mesh_ndim(); ++m)
    if (is_partial(l[m]) && std::get<Partial>(l[m]).op == ReduceOp::Sum && mesh.coordinate()[m] != 0) zero = true;
  if (zero)
    local.zero_();
  else
    fill(local, box);
  return DTensor::from_local(std::move(local), mesh, l, shape, FromLocalCheck::Trust);
}

}  // namespace

DTensor full(const Shape& shape, double value, const DeviceMesh& mesh, const Layout& layout, DType dtype) {
  return make(shape, mesh, layout, dtype, "full", [&](Tensor& t, const Box&) { t.fill(value); });
}
DTensor zeros(const Shape& shape, const DeviceMesh& mesh, const Layout& layout, DType dtype) {
  return full(shape, 0.0, mesh, layout, dtype);
}
DTensor ones(const Shape& shape, const DeviceMesh& mesh, const Layout& layout, DType dtype) {
  return full(shape, 1.0, mesh, layout, dtype);
}

DTensor arange(const Shape& shape, const DeviceMesh& mesh, const Layout& layout, DType dtype) {
  return make(shape, mesh, layout, dtype, "arange", [&](Tensor& out, const Box& box) {
    if (out.numel() == 0) return;
    const Shape strides = row_major_strides(shape);
    const int nd = box.ndim();
    // Computed on the host (in f32 for bf16/f16, then rounded), then moved.
    Tensor t = Tensor::empty(box.size, cpu_compute_dtype(dtype));
    visit_dtype(t.dtype(), [&](auto z) {
      using T = decltype(z);
      T* p = t.data_as<T>();
      Shape idx(nd, 0);
      for (std::int64_t i = 0; i < t.numel(); ++i) {
        std::int64_t g = 0;
        for (int d = 0; d < nd; ++d) g += (box.offset[d] + idx[d]) * strides[d];
        p[i] = static_cast<T>(g);
        for (int d = nd - 1; d >= 0 && ++idx[d] == box.size[d]; --d) idx[d] = 0;
      }
    });
    out = t.to(dtype).to(out.device());
  });
}

DTensor rand(const Shape& shape, std::uint64_t seed, const DeviceMesh& mesh, const Layout& layout, DType dtype) {
  return make(shape, mesh, layout, dtype, "rand",
              [&](Tensor& t, const Box& box) { fill_random(t, seed, shape, box.offset); });
}
DTensor randn(const Shape& shape, std::uint64_t seed, const DeviceMesh& mesh, const Layout& layout, DType dtype) {
  return make(shape, mesh, layout, dtype, "randn",
              [&](Tensor& t, const Box& box) { fill_randn(t, seed, shape, box.offset); });
}

DTensor from_full(const Tensor& full, const DeviceMesh& mesh, const Layout& layout) {
  return make(full.shape(), mesh, layout, full.dtype(), "from_full",
              [&](Tensor& t, const Box& box) { t = slice_box(full, box).to(mesh.device()); });
}

namespace detail {
namespace {

// What a piece that got no gradient is: zeros of its shape and layout.
struct PieceLike {
  Shape shape;
  DType dtype;
  Device device;
  std::optional<DeviceMesh> mesh;  // DTensor pieces
  Layout layout;
};

template <class X>
class SplitNode final : public GroupNode {
 public:
  SplitNode(int dim, std::vector<PieceLike> pieces) : GroupNode(pieces.size()), dim_(dim), pieces_(std::move(pieces)) {}
  std::string name() const override { return "split"; }
  void release() override { released = true; }

 protected:
  std::vector<std::optional<AnyTensor>> backward(std::vector<std::optional<AnyTensor>> arrived) override {
    std::vector<X> grads;
    for (std::size_t k = 0; k < arrived.size(); ++k) {
      if (arrived[k]) {
        grads.push_back(std::get<X>(std::move(*arrived[k])));
      } else if constexpr (std::same_as<X, DTensor>) {
        grads.push_back(zeros(pieces_[k].shape, *pieces_[k].mesh, pieces_[k].layout, pieces_[k].dtype));
      } else {
        grads.push_back(Tensor::zeros(pieces_[k].shape, pieces_[k].dtype, pieces_[k].device));
      }
    }
    return {AnyTensor(cat(std::span<const X>(grads), dim_))};
  }

 private:
  int dim_;
  std::vector<PieceLike> pieces_;
};

template <class X>
std::vector<X> split_recorded(const X& x, int dim, const std::vector<std::int64_t>& sizes) {
  const bool recording = grad_enabled() && in_graph(x.autograd_meta());
  std::vector<X> out;
  {
    std::optional<NoGradGuard> unrecorded;
    if (recording) unrecorded.emplace();
    std::int64_t start = 0;
    for (auto s : sizes) {
      out.push_back(narrow(x, dim, start, s));
      start += s;
    }
  }
  if (!recording) return out;
  std::vector<PieceLike> pieces;
  for (const X& piece : out) {
    if constexpr (std::same_as<X, DTensor>)
      pieces.push_back({piece.shape(), piece.dtype(), piece.mesh().device(), piece.mesh(), piece.placements()});
    else
      pieces.push_back({piece.shape(), piece.dtype(), piece.device(), std::nullopt, Layout{}});
  }
  auto group = std::make_shared<SplitNode<X>>(dim, std::move(pieces));
  group->edges.push_back(edge_of(x.autograd_meta()));
  for (std::size_t k = 0; k < out.size(); ++k) attach_part(out[k], group, k);
  return out;
}

}  // namespace

std::vector<Tensor> split_pieces(const Tensor& x, int dim, const std::vector<std::int64_t>& sizes) {
  return split_recorded(x, dim, sizes);
}
std::vector<DTensor> split_pieces(const DTensor& x, int dim, const std::vector<std::int64_t>& sizes) {
  return split_recorded(x, dim, sizes);
}

}  // namespace detail
}  // namespace dtensor
