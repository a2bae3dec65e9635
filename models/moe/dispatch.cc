// The experts' dispatch: rows numbered for the all-to-alls, and the group's round trips.
#include "models/moe/dispatch.h"

#include <fmt/ranges.h>  // fmt::join

#include "core/error.h"  // ZEROTH_CHECK

namespace zeroth::gpt {

ExpertRows::ExpertRows(const Routing& r, int ep) {
  const int E = static_cast<int>(r.offsets.size()) - 1, n = E / ep;
  // Expert e is slot e mod n of rank e / n; its rows start at `start[e]` in slot-then-rank order.
  std::vector<size_t> start(E, 0);
  sent.assign(static_cast<size_t>(E), 0);
  size_t at = 0;
  for (int j = 0; j < n; ++j) {
    for (int p = 0; p < ep; ++p) {
      const int e = p * n + j;
      start[e] = at;
      sent[static_cast<size_t>(j) * ep + p] = r.offsets[e + 1] - r.offsets[e];
      at += sent[static_cast<size_t>(j) * ep + p];
    }
  }
  row.assign(r.row.size(), -1);
  row_token.assign(r.row_token.size(), 0);
  for (size_t c = 0; c < r.row.size(); ++c) {
    if (r.row[c] < 0) continue;
    const int e = r.expert[c];
    const size_t to = start[e] + (static_cast<size_t>(r.row[c]) - r.offsets[e]);
    row[c] = static_cast<int32_t>(to);
    row_token[to] = r.row_token[static_cast<size_t>(r.row[c])];
  }
}

size_t ExpertRows::sent_total() const {
  size_t n = 0;
  for (size_t v : sent) n += v;
  return n;
}
size_t ExpertRows::received_total() const {
  size_t n = 0;
  for (size_t v : received) n += v;
  return n;
}
size_t ExpertRows::received_in(int slot, int ep) const {
  size_t n = 0;
  for (int p = 0; p < ep; ++p) n += received[static_cast<size_t>(slot) * ep + p];
  return n;
}

Event& ExpertGroup::event(size_t i) const {
  while (events_->size() <= i) events_->push_back(compute_.device().create_event());
  return *(*events_)[i];
}

// Event 0 carries each hand-over between the two streams (each wait is enqueued before the next
// record), event 1 + j slot j's results being made.
void ExpertGroup::hand_over(Stream& from, Stream& to) const {
  if (exchange_ == nullptr) return;
  event(0).record(from);
  to.wait(event(0));
}

void ExpertGroup::round_trip(ExpertRows& rows, bool record_counts, const Trip& t, const SlotWork& slot,
                             const std::function<void()>& after) const {
  const int n = dims_.local_experts();
  if (comm_ == nullptr || dims_.ep == 1) {
    ZEROTH_CHECK(t.send == t.recv && t.results == t.back, "expert rows without a group stay in place");
    if (record_counts) rows.received = rows.sent;
    size_t at = 0;
    for (int j = 0; j < n; ++j) {
      slot(j, at, rows.received[j]);
      at += rows.received[j];
    }
    after();
    return;
  }
  Stream& x = exchange_ != nullptr ? *exchange_ : compute_;
  hand_over(compute_, x);  // the rows to send are made
  try {
    exchange(rows, record_counts, t, slot, after);
  } catch (...) {
    // What the exchange stream still has queued writes the layer's buffers: later compute work
    // (and whoever frees them) waits for it.
    hand_over(x, compute_);
    throw;
  }
  hand_over(x, compute_);  // the results are back
}

void ExpertGroup::exchange(ExpertRows& rows, bool record_counts, const Trip& t, const SlotWork& slot,
                           const std::function<void()>& after) const {
  const int ep = dims_.ep, n = dims_.local_experts();
  const size_t C = static_cast<size_t>(dims_.C);
  Stream& x = exchange_ != nullptr ? *exchange_ : compute_;
  std::vector<size_t> got_rows(rows.sent.size(), 0);
  if (record_counts) rows.received.assign(rows.sent.size(), 0);
  size_t sent_at = 0, recv_at = 0;
  std::vector<size_t> counts(static_cast<size_t>(ep));
  for (int j = 0; j < n; ++j) {
    size_t total = 0;
    for (int p = 0; p < ep; ++p) total += counts[p] = rows.sent[static_cast<size_t>(j) * ep + p] * C;
    const TensorView send{const_cast<float*>(t.send) + sent_at, total, DType::f32};
    const TensorView recv{t.recv + recv_at, t.room * C - recv_at, DType::f32};
    const std::vector<size_t> got = comm_->all_to_allv(x, send, counts, recv);
    for (int p = 0; p < ep; ++p) {
      const size_t i = static_cast<size_t>(j) * ep + p;
      got_rows[i] = got[p] / C;
      if (record_counts) rows.received[i] = got_rows[i];
      recv_at += got[p];
    }
    sent_at += total;
    // The slot's rows where the forward received them (a backward that got others fails below).
    size_t at = 0;
    for (int q = 0; q < j; ++q) at += rows.received_in(q, ep);
    hand_over(x, compute_);
    slot(j, at, rows.received_in(j, ep));
    if (exchange_ != nullptr) event(1 + static_cast<size_t>(j)).record(compute_);
  }
  // After every slot's exchange, so a rank that finds a difference has not left its peers waiting.
  ZEROTH_CHECK(got_rows == rows.received, "an expert layer's backward received other row counts than its forward: [{}] against [{}]",
               fmt::join(got_rows, ", "), fmt::join(rows.received, ", "));
  // Enqueued before the returns: a backend whose count exchange waits for its stream (NCCL) holds
  // the caller at each return until that slot's results are made.
  after();
  sent_at = recv_at = 0;
  for (int j = 0; j < n; ++j) {
    if (exchange_ != nullptr) x.wait(event(1 + static_cast<size_t>(j)));
    size_t back = 0, total = 0;
    for (int p = 0; p < ep; ++p) {
      total += counts[p] = rows.received[static_cast<size_t>(j) * ep + p] * C;
      back += rows.sent[static_cast<size_t>(j) * ep + p] * C;
    }
    const TensorView send{const_cast<float*>(t.results) + recv_at, total, DType::f32};
    const TensorView recv{t.back + sent_at, back, DType::f32};
    const std::vector<size_t> got = comm_->all_to_allv(x, send, counts, recv);
    for (int p = 0; p < ep; ++p) {
      ZEROTH_CHECK(got[p] == rows.sent[static_cast<size_t>(j) * ep + p] * C,
                   "expert slot {}: rank {} returned {} elements for the {} rows sent to it", j, p, got[p],
                   rows.sent[static_cast<size_t>(j) * ep + p]);
    }
    recv_at += total;
    sent_at += back;
  }
}

}  // namespace zeroth::gpt
