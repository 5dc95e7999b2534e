// ArenaMessages: a gRPC callback-API message allocator that puts a call's request and
// response on one protobuf Arena whose first block lives inside the per-call holder. A
// reply made of many sub-messages (Stats' pools, ListCaches' caches, Describe's layers)
// then costs one heap allocation instead of one per message, and is freed at once
// rather than message by message. Registered per method with the generated
// SetMessageAllocatorFor_<Method>; it must outlive the server.
//
// Thread-safe: each call gets its own holder.
#ifndef KVARENA_DAEMON_ARENA_MESSAGES_H_
#define KVARENA_DAEMON_ARENA_MESSAGES_H_

#include <google/protobuf/arena.h>
#include <grpcpp/support/message_allocator.h>

#include <cstddef>

namespace kvarena {

template <typename Req, typename Resp>
class ArenaMessages final : public grpc::MessageAllocator<Req, Resp> {
 public:
  grpc::MessageHolder<Req, Resp>* AllocateMessages() override { return new Holder; }

 private:
  // Room for a whole-arena Stats reply over a few dozen pools without a second block.
  static constexpr size_t kInlineBytes = 8192;

  class Holder final : public grpc::MessageHolder<Req, Resp> {
   public:
    Holder() : arena_(Options(block_)) {
      this->set_request(google::protobuf::Arena::CreateMessage<Req>(&arena_));
      this->set_response(google::protobuf::Arena::CreateMessage<Resp>(&arena_));
    }
    void Release() override { delete this; }

   private:
    static google::protobuf::ArenaOptions Options(char* block) {
      google::protobuf::ArenaOptions options;
      options.initial_block = block;
      options.initial_block_size = kInlineBytes;
      return options;
    }

    alignas(alignof(std::max_align_t)) char block_[kInlineBytes];
    google::protobuf::Arena arena_;  // after block_, which it uses, and destroyed before it
  };
};

}  // namespace kvarena

#endif  // KVARENA_DAEMON_ARENA_MESSAGES_H_
