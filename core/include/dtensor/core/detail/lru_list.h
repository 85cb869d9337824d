#pragma once
// Internal: the recency order of a bounded cache. Nodes carry their own
// links (T has `T* lru_prev` and `T* lru_next`), so that marking a hit as
// most recent is a few pointer writes and never allocates. Not thread-safe:
// the caches that use it are per thread.
#include <cstddef>

namespace dtensor {

template <class T>
class LruList {
 public:
  std::size_t size() const { return size_; }
  /// The least recently used node (null when empty).
  T* back() const { return tail_; }

  void push_front(T* n) {
    n->lru_prev = nullptr;
    n->lru_next = head_;
    if (head_) head_->lru_prev = n;
    head_ = n;
    if (!tail_) tail_ = n;
    ++size_;
  }
  void unlink(T* n) {
    (n->lru_prev ? n->lru_prev->lru_next : head_) = n->lru_next;
    (n->lru_next ? n->lru_next->lru_prev : tail_) = n->lru_prev;
    n->lru_prev = n->lru_next = nullptr;
    --size_;
  }
  /// Marks `n` (already in the list) most recently used.
  void touch(T* n) {
    if (n == head_) return;
    unlink(n);
    push_front(n);
  }

 private:
  T* head_ = nullptr;
  T* tail_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace dtensor
