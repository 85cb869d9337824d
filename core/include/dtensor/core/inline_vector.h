#pragma once
// A vector of trivially copyable values that keeps its first N elements
// inside the object and goes to the heap only beyond them. Shapes, strides,
// offsets and mesh coordinates are vectors of a handful of int64s: as
// std::vector every Tensor copy (a kernel's span of inputs, a saved input
// of autograd) paid a heap allocation for one; held inline it costs none.
// The interface is std::vector's, so that code written against
// std::vector<int64_t> reads the same; it converts to and from std::vector
// for the few interfaces (JSON, Python-facing tools) that want one.
//
// InlineArray, below it, is the scratch array of a hot path whose elements
// InlineVector cannot hold (a Tensor): its size is fixed when it is made.
#include <algorithm>
#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <new>
#include <ostream>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <vector>

namespace dtensor {

template <class T, std::size_t N>
class InlineVector {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>,
                "InlineVector holds trivially copyable values only (it copies them as bytes)");
  static_assert(N > 0);

 public:
  using value_type = T;
  using size_type = std::size_t;
  using difference_type = std::ptrdiff_t;
  using reference = T&;
  using const_reference = const T&;
  using pointer = T*;
  using const_pointer = const T*;
  using iterator = T*;
  using const_iterator = const T*;
  using reverse_iterator = std::reverse_iterator<iterator>;
  using const_reverse_iterator = std::reverse_iterator<const_iterator>;

  InlineVector() noexcept = default;
  explicit InlineVector(size_type n, const T& value = T()) { assign(n, value); }
  InlineVector(std::initializer_list<T> values) { assign(values.begin(), values.end()); }
  template <std::input_iterator It>
  InlineVector(It first, It last) {
    assign(first, last);
  }
  InlineVector(const std::vector<T>& v) { assign(v.begin(), v.end()); }  // NOLINT: implicit, as the alias it replaced
  explicit InlineVector(std::span<const T> values) { assign(values.begin(), values.end()); }

  InlineVector(const InlineVector& other) { assign(other.begin(), other.end()); }
  InlineVector(InlineVector&& other) noexcept { steal(other); }
  InlineVector& operator=(const InlineVector& other) {
    if (this != &other) assign(other.begin(), other.end());
    return *this;
  }
  InlineVector& operator=(InlineVector&& other) noexcept {
    if (this != &other) {
      release();
      steal(other);
    }
    return *this;
  }
  InlineVector& operator=(std::initializer_list<T> values) {
    assign(values.begin(), values.end());
    return *this;
  }
  ~InlineVector() { release(); }

  operator std::vector<T>() const { return std::vector<T>(begin(), end()); }  // NOLINT: implicit by design

  // ---- Size and storage ----
  size_type size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  size_type capacity() const noexcept { return heap_ ? capacity_ : N; }
  static constexpr size_type max_size() noexcept { return UINT32_MAX; }
  T* data() noexcept { return heap_ ? heap_ : inline_; }
  const T* data() const noexcept { return heap_ ? heap_ : inline_; }
  void reserve(size_type n) {
    if (n > capacity()) grow_to(n);
  }
  void shrink_to_fit() noexcept {}
  /// What it holds on the heap (0 while inline), for the caches' byte budgets.
  std::size_t heap_bytes() const noexcept { return heap_ ? capacity_ * sizeof(T) : 0; }
  void clear() noexcept { size_ = 0; }
  void resize(size_type n, const T& value = T()) {
    reserve(n);
    std::fill(data() + std::min<size_type>(n, size_), data() + n, value);
    size_ = static_cast<std::uint32_t>(n);
  }

  // ---- Elements ----
  T& operator[](size_type i) noexcept { return data()[i]; }
  const T& operator[](size_type i) const noexcept { return data()[i]; }
  T& at(size_type i) {
    if (i >= size_) throw std::out_of_range("InlineVector::at");
    return data()[i];
  }
  const T& at(size_type i) const {
    if (i >= size_) throw std::out_of_range("InlineVector::at");
    return data()[i];
  }
  T& front() noexcept { return data()[0]; }
  const T& front() const noexcept { return data()[0]; }
  T& back() noexcept { return data()[size_ - 1]; }
  const T& back() const noexcept { return data()[size_ - 1]; }

  iterator begin() noexcept { return data(); }
  iterator end() noexcept { return data() + size_; }
  const_iterator begin() const noexcept { return data(); }
  const_iterator end() const noexcept { return data() + size_; }
  const_iterator cbegin() const noexcept { return begin(); }
  const_iterator cend() const noexcept { return end(); }
  reverse_iterator rbegin() noexcept { return reverse_iterator(end()); }
  reverse_iterator rend() noexcept { return reverse_iterator(begin()); }
  const_reverse_iterator rbegin() const noexcept { return const_reverse_iterator(end()); }
  const_reverse_iterator rend() const noexcept { return const_reverse_iterator(begin()); }

  // ---- Changes ----
  void assign(size_type n, const T& value) {
    size_ = 0;
    resize(n, value);
  }
  template <std::input_iterator It>
  void assign(It first, It last) {
    size_ = 0;
    if constexpr (std::forward_iterator<It>) {
      reserve(static_cast<size_type>(std::distance(first, last)));
      std::copy(first, last, data());
      size_ = static_cast<std::uint32_t>(std::distance(first, last));
    } else {
      for (; first != last; ++first) push_back(*first);
    }
  }
  void assign(std::initializer_list<T> values) { assign(values.begin(), values.end()); }
  void push_back(const T& value) {
    const T copy = value;  // value may be an element of this vector, freed by growing
    if (size_ == capacity()) grow_to(2 * capacity());
    data()[size_++] = copy;
  }
  template <class... Args>
  T& emplace_back(Args&&... args) {
    push_back(T(std::forward<Args>(args)...));
    return back();
  }
  void pop_back() noexcept { --size_; }
  iterator insert(const_iterator pos, const T& value) { return insert(pos, size_type{1}, value); }
  iterator insert(const_iterator pos, size_type n, const T& value) {
    const size_type at = make_room(pos, n);
    std::fill(data() + at, data() + at + n, value);
    return data() + at;
  }
  template <std::forward_iterator It>
  iterator insert(const_iterator pos, It first, It last) {
    const InlineVector values(first, last);  // [first, last) may lie in this vector: copied first
    const size_type at = make_room(pos, values.size());
    std::copy(values.begin(), values.end(), data() + at);
    return data() + at;
  }
  iterator insert(const_iterator pos, std::initializer_list<T> values) {
    return insert(pos, values.begin(), values.end());
  }
  iterator erase(const_iterator pos) { return erase(pos, pos + 1); }
  iterator erase(const_iterator first, const_iterator last) {
    T* d = data();
    const auto at = static_cast<size_type>(first - d);
    const auto n = static_cast<size_type>(last - first);
    std::memmove(d + at, d + at + n, (size_ - at - n) * sizeof(T));
    size_ -= static_cast<std::uint32_t>(n);
    return d + at;
  }
  void swap(InlineVector& other) noexcept {
    InlineVector tmp(std::move(other));
    other = std::move(*this);
    *this = std::move(tmp);
  }

  friend bool operator==(const InlineVector& a, const InlineVector& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend auto operator<=>(const InlineVector& a, const InlineVector& b) {
    return std::lexicographical_compare_three_way(a.begin(), a.end(), b.begin(), b.end());
  }
  friend std::ostream& operator<<(std::ostream& os, const InlineVector& v) {
    os << '[';
    for (size_type i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
    return os << ']';
  }

 private:
  void release() noexcept {
    ::operator delete(heap_);
    heap_ = nullptr;
  }
  void steal(InlineVector& other) noexcept {
    size_ = other.size_;
    if (other.heap_) {
      heap_ = other.heap_;
      capacity_ = other.capacity_;
      other.heap_ = nullptr;
    } else {
      // GCC 12 at -O3, inlining this into std::vector<Tensor>'s growth,
      // reports the copy out of bounds of a smaller buffer on a path where
      // the destination is the new one (a false positive of its
      // -Warray-bounds, GCC bug 105762's family); size_ <= N here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#endif
      std::memcpy(inline_, other.inline_, std::min<size_type>(size_, N) * sizeof(T));
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
    }
    other.size_ = 0;
  }
  void grow_to(size_type n) {
    n = std::max(n, N + 1);
    if (n > max_size()) throw std::length_error("InlineVector: more than 2^32-1 elements");
    T* fresh = static_cast<T*>(::operator new(n * sizeof(T)));
    std::memcpy(fresh, data(), size_ * sizeof(T));
    release();
    heap_ = fresh;
    capacity_ = static_cast<std::uint32_t>(n);
  }
  // Opens n slots at pos (shifting the tail) and returns pos's index.
  size_type make_room(const_iterator pos, size_type n) {
    const auto at = static_cast<size_type>(pos - data());
    reserve(size_ + n);
    T* d = data();
    std::memmove(d + at + n, d + at, (size_ - at) * sizeof(T));
    size_ += static_cast<std::uint32_t>(n);
    return at;
  }

  T* heap_ = nullptr;  // null: the elements live in inline_
  std::uint32_t size_ = 0;
  std::uint32_t capacity_ = 0;  // of heap_, when set
  T inline_[N];
};

/// n value-initialised Ts, n fixed at construction: inside the object for
/// n <= N (no allocation), on the heap beyond. For element types that are
/// not trivially copyable; InlineVector is the one for those that are.
template <class T, std::size_t N>
class InlineArray {
 public:
  explicit InlineArray(std::size_t n) : size_(n) {
    if (n > N) heap_.resize(n);
  }
  InlineArray(const InlineArray&) = delete;
  InlineArray& operator=(const InlineArray&) = delete;

  std::size_t size() const noexcept { return size_; }
  T* data() noexcept { return size_ > N ? heap_.data() : inline_.data(); }
  const T* data() const noexcept { return size_ > N ? heap_.data() : inline_.data(); }
  T& operator[](std::size_t i) noexcept { return data()[i]; }
  const T& operator[](std::size_t i) const noexcept { return data()[i]; }
  T* begin() noexcept { return data(); }
  T* end() noexcept { return data() + size_; }
  const T* begin() const noexcept { return data(); }
  const T* end() const noexcept { return data() + size_; }

 private:
  std::array<T, N> inline_{};
  std::vector<T> heap_;
  std::size_t size_;
};

}  // namespace dtensor
