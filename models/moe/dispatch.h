// The experts' dispatch: each choice's row numbered for the expert-parallel group's all-to-alls
// (ExpertRows), and the group's round trip of rows out and results back, overlapped with the
// experts' products where an exchange stream is given (ExpertGroup).
#pragma once

#include <cstddef>     // size_t
#include <cstdint>     // int32_t
#include <functional>  // std::function
#include <memory>      // std::unique_ptr
#include <vector>      // std::vector

#include "comm/communicator.h"    // Communicator
#include "core/device.h"          // Stream, Event
#include "models/decoder/dims.h"  // Dims
#include "models/moe/router.h"    // gpt::Routing

namespace zeroth::gpt {

// The dispatched rows are numbered by local expert slot, then by the rank holding it (slot j of
// rank p is expert p n + j): each slot's rows go to the ranks as one contiguous run per rank, and
// arrive as one contiguous run per slot. With one rank this is the experts' own order.
struct ExpertRows {
  std::vector<int32_t> row, row_token;  // the routing's, renumbered
  std::vector<size_t> sent;             // [slot x ep + peer]: rows sent to that peer's slot
  std::vector<size_t> received;         // [slot x ep + peer]: rows that peer sent to this rank's slot
  size_t sent_total() const;
  size_t received_total() const;
  size_t received_in(int slot, int ep) const;  // this rank's rows of one slot, from every peer
  ExpertRows(const Routing& routing, int ep);
  ExpertRows() = default;
};

// The expert-parallel group's all-to-alls, one per local expert slot each way (each slot's rows from
// every rank land together, so an expert multiplies one run). On a stream of their own (`exchange`)
// they run under the products: the later slots' rows arrive while slot j's expert computes, and once
// every slot's rows are in, each slot's results leave as they are made; without one they run in turn
// on the compute stream.
// One rank: the rows stay where they are (the caller passes the same buffers both ways).
class ExpertGroup {
 public:
  // `events` (grown here) order the two streams; the group's passes reuse them.
  ExpertGroup(Communicator* comm, Stream& compute, Stream* exchange, std::vector<std::unique_ptr<Event>>* events, const Dims& dims)
      : comm_(comm), compute_(compute), exchange_(exchange), events_(events), dims_(dims) {}
  // Rows [at, at + n) of the received rows of local slot j.
  using SlotWork = std::function<void(int j, size_t at, size_t n)>;
  struct Trip {
    const float* send;  // this rank's rows [rows.sent_total(), C], ExpertRows order
    float* recv;        // the rows its experts receive (room for `room` rows)
    size_t room;
    const float* results;  // the experts' results at the received rows
    float* back;           // the results of this rank's rows, in `send`'s order
  };
  // One round trip: the rows out; `slot` enqueues slot j's compute work once its rows are in (and
  // before its results leave); `after` enqueues compute work that needs no exchange, under the
  // results' return; later compute work sees `back` complete. With record_counts (a layer's
  // forward) what came from whom is kept in rows.received; otherwise (recomputation, backward) it
  // is checked to be the same.
  void round_trip(ExpertRows& rows, bool record_counts, const Trip& t, const SlotWork& slot, const std::function<void()>& after) const;

 private:
  Event& event(size_t i) const;
  void hand_over(Stream& from, Stream& to) const;
  // round_trip's exchanges and the compute work between them, from the rows made to the results back.
  void exchange(ExpertRows& rows, bool record_counts, const Trip& t, const SlotWork& slot, const std::function<void()>& after) const;

  Communicator* comm_;
  Stream& compute_;
  Stream* exchange_;
  std::vector<std::unique_ptr<Event>>* events_;
  Dims dims_;
};

}  // namespace zeroth::gpt
