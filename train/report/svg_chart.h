// Charts as inline SVG for the run report (train/report/run_report.h): line charts whose every series
// is drawn four ways (linear or log y, raw or smoothed) and shown by two checkboxes through CSS,
// so the chart reads and prints without script; stacked areas; a Gantt chart of spans. Long
// series are thinned to a bounded number of points that keeps each stretch's minimum and maximum.
#pragma once

#include <cstddef>  // size_t
#include <string>   // std::string
#include <vector>   // std::vector

namespace zeroth::report {

struct Series {
  std::string name;
  std::vector<double> x, y;
  std::string color;     // CSS color
  bool markers = false;  // points as circles (validation losses, skipped steps), no line
  bool hollow = false;   // markers drawn as rings, set apart from a line of the same color
};

struct Chart {
  std::string id;  // the figure's id
  std::string title;
  std::string x_label, y_label;
  bool log_toggle = false;     // a checkbox for a log-scale y
  bool smooth_toggle = false;  // a checkbox for an exponential moving average (weight 0.9, debiased)
  // A second x axis along the top: x times this, under this label ("tokens"); 0: none.
  double top_scale = 0;
  std::string top_label;
};

// The indices of `y` that a chart of at most `max_points` points keeps: the first, the last, and
// each of about max_points / 2 stretches' minimum and maximum, in order.
std::vector<size_t> thin(const std::vector<double>& y, size_t max_points);
// TensorBoard's smoothing: an exponential moving average, divided by the weights' sum so far.
std::vector<double> smooth(const std::vector<double>& y, double weight = 0.9);

// A <figure> holding the chart, its axes, legend and toggles; "" when no series has a point.
std::string line_chart(const Chart& chart, const std::vector<Series>& series, size_t max_points = 2000);
// Series stacked from the bottom (each filled down to the one before): parts of a whole.
std::string stacked_chart(const Chart& chart, const std::vector<Series>& parts, size_t max_points = 2000);

struct Span {
  int row = 0;  // lane, top to bottom
  double start = 0, end = 0;
  std::string label;  // drawn inside when it fits, and as the span's tooltip
  std::string color;
};
// One lane per row name, time along x (`unit`: the x label, e.g. "ms").
std::string gantt_chart(const Chart& chart, const std::vector<std::string>& rows, const std::vector<Span>& spans);

// Text safe inside HTML elements and attribute values.
std::string escape(const std::string& text);
// Round numbers for axis ticks between lo and hi, about `count` of them.
std::vector<double> nice_ticks(double lo, double hi, int count);
// A tick's label: short, SI-suffixed for large values ("12k", "3.5M").
std::string tick_label(double v);

}  // namespace zeroth::report
