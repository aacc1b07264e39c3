#pragma once
// An owned Cap'n Proto message: built once by the sender, then read (never changed) by the
// receiver. In one process it is passed by pointer, so nothing is re-encoded; flat() gives
// the bytes that would cross a process boundary.

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cstddef>
#include <memory>
#include <vector>

namespace tireless {

template <class T>
class owned {
 public:
  // first_segment_words: size the first segment to the message (STACK.md: 160 words for a
  // typical small message avoids both the default 1024-word segment and reallocation).
  explicit owned(unsigned first_segment_words = 160)
      : msg_(std::make_shared<capnp::MallocMessageBuilder>(first_segment_words)) {}

  // A copy of a message read elsewhere (an RPC reply, which belongs to its connection).
  static owned copy_of(typename T::Reader r) {
    owned o(static_cast<unsigned>(r.totalSize().wordCount + 8));
    o.msg_->setRoot(r);
    return o;
  }

  typename T::Builder init() { return msg_->initRoot<T>(); }
  typename T::Builder builder() { return msg_->getRoot<T>(); }
  typename T::Reader get() const { return msg_->getRoot<T>().asReader(); }
  explicit operator bool() const { return msg_ != nullptr; }

  size_t size_bytes() const { return capnp::computeSerializedSizeInWords(*msg_) * sizeof(capnp::word); }

  std::vector<std::byte> flat() const {
    auto words = capnp::messageToFlatArray(*msg_);
    auto bytes = words.asBytes();
    return {reinterpret_cast<const std::byte*>(bytes.begin()),
            reinterpret_cast<const std::byte*>(bytes.end())};
  }

 private:
  std::shared_ptr<capnp::MallocMessageBuilder> msg_;
};

}  // namespace tireless
