#include "train/report/svg_chart.h"

#include <algorithm>  // std::min_element
#include <cmath>      // std::log10, std::isfinite
#include <limits>     // std::numeric_limits

#include <fmt/format.h>

namespace zeroth::report {

namespace {

// The plot's frame inside the SVG's viewBox.
constexpr double kWidth = 680, kHeight = 260, kLeft = 64, kRight = 28, kTop = 28, kBottom = 40;
constexpr double kPlotW = kWidth - kLeft - kRight, kPlotH = kHeight - kTop - kBottom;

struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    if (!std::isfinite(v)) return;
    lo = std::min(lo, v), hi = std::max(hi, v);
  }
  bool empty() const { return lo > hi; }
  // A range a scale can divide by: a single value widened around itself.
  Range usable() const {
    Range r = *this;
    if (r.hi - r.lo <= 0) {
      const double pad = r.lo == 0 ? 1 : std::abs(r.lo) * 0.05;
      r.lo -= pad, r.hi += pad;
    }
    return r;
  }
};

struct Scale {
  Range x, y;
  bool log = false;
  double px(double v) const { return kLeft + (v - x.lo) / (x.hi - x.lo) * kPlotW; }
  double py(double v) const {
    const double t = log ? std::log10(v) : v;
    return kTop + kPlotH - (t - y.lo) / (y.hi - y.lo) * kPlotH;
  }
  bool shows(double v) const { return std::isfinite(v) && (!log || v > 0); }
};

std::string x_axis(const Chart& c, const Scale& s) {
  std::string out = "<g class=\"axis x\">";
  out += fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}"/>)", kLeft, kTop + kPlotH, kLeft + kPlotW,
                     kTop + kPlotH);
  for (double t : nice_ticks(s.x.lo, s.x.hi, 6)) {
    const double x = s.px(t);
    out += fmt::format(
        R"(<line x1="{0:.1f}" y1="{1:.1f}" x2="{0:.1f}" y2="{2:.1f}"/><text x="{0:.1f}" y="{3:.1f}" text-anchor="middle">{4}</text>)",
        x, kTop + kPlotH, kTop + kPlotH + 4, kTop + kPlotH + 16, tick_label(t));
    if (c.top_scale > 0)
      out += fmt::format(R"(<text class="top" x="{:.1f}" y="{:.1f}" text-anchor="middle">{}</text>)", x, kTop - 6,
                         tick_label(t * c.top_scale));
  }
  out += fmt::format(R"(<text class="label" x="{:.1f}" y="{:.1f}" text-anchor="middle">{}</text>)", kLeft + kPlotW / 2, kHeight - 4,
                     escape(c.x_label));
  if (c.top_scale > 0)
    out += fmt::format(R"(<text class="label top" x="{:.1f}" y="{:.1f}" text-anchor="end">{}</text>)", kLeft - 6, 12.0,
                       escape(c.top_label));
  return out + "</g>";
}

std::string y_axis(const Chart& c, const Scale& s, const char* variant) {
  std::string out = fmt::format("<g class=\"axis y {}\">", variant);
  out += fmt::format(R"(<line x1="{0:.1f}" y1="{1:.1f}" x2="{0:.1f}" y2="{2:.1f}"/>)", kLeft, kTop, kTop + kPlotH);
  std::vector<double> ticks;
  if (s.log) {
    for (double e = std::ceil(s.y.lo); e <= std::floor(s.y.hi) + 1e-9; ++e) ticks.push_back(std::pow(10.0, e));
    if (ticks.size() < 2) {
      ticks.clear();
      for (double t : nice_ticks(std::pow(10.0, s.y.lo), std::pow(10.0, s.y.hi), 4))
        if (t > 0) ticks.push_back(t);
    }
  } else {
    ticks = nice_ticks(s.y.lo, s.y.hi, 5);
  }
  for (double t : ticks) {
    const double y = s.py(t);
    out += fmt::format(
        R"(<line class="grid" x1="{0:.1f}" y1="{1:.1f}" x2="{2:.1f}" y2="{1:.1f}"/><text x="{3:.1f}" y="{4:.1f}" text-anchor="end">{5}</text>)",
        kLeft, y, kLeft + kPlotW, kLeft - 6, y + 4, tick_label(t));
  }
  out += fmt::format(R"~(<text class="label" transform="translate(14 {:.1f}) rotate(-90)" text-anchor="middle">{}</text>)~",
                     kTop + kPlotH / 2, escape(c.y_label));
  return out + "</g>";
}

std::string polyline(const Series& s, const std::vector<double>& y, const Scale& sc, size_t max_points, const char* classes) {
  const auto keep = thin(y, max_points);
  std::string points;
  size_t drawn = 0;
  for (size_t i : keep) {
    if (!sc.shows(y[i])) continue;
    points += fmt::format("{}{:.1f},{:.1f}", drawn == 0 ? "" : " ", sc.px(s.x[i]), sc.py(y[i]));
    ++drawn;
  }
  return fmt::format(R"(<polyline class="{}" data-series="{}" data-recorded="{}" data-drawn="{}" stroke="{}" points="{}"/>)", classes,
                     escape(s.name), s.y.size(), drawn, s.color, points);
}

std::string markers(const Series& s, const Scale& sc, const char* variant) {
  std::string out =
      fmt::format(R"(<g class="markers {}" data-series="{}" data-recorded="{}" fill="{}" stroke="{}" stroke-width="1.5">)", variant,
                  escape(s.name), s.y.size(), s.hollow ? "#fff" : s.color, s.color);
  for (size_t i = 0; i < s.y.size(); ++i) {
    if (!sc.shows(s.y[i])) continue;
    out += fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="3"><title>{}: {} at {}</title></circle>)", sc.px(s.x[i]), sc.py(s.y[i]),
                       escape(s.name), tick_label(s.y[i]), tick_label(s.x[i]));
  }
  return out + "</g>";
}

std::string figure(const Chart& c, const std::string& toggles, const std::string& body, const std::vector<Series>& series) {
  std::string legend;
  for (const auto& s : series)
    legend += fmt::format(R"(<span><i style="{}"></i>{}</span>)",
                          s.hollow ? "border:2px solid " + s.color + ";border-radius:50%;width:6px;height:6px"
                                   : "background:" + s.color,
                          escape(s.name));
  return fmt::format(R"(<figure class="chart" id="{}" data-log="0" data-smooth="0"><figcaption>{}{}</figcaption>)"
                     R"(<svg viewBox="0 0 {} {}" role="img" aria-label="{}">{}</svg><div class="legend">{}</div></figure>)",
                     escape(c.id), escape(c.title), toggles, kWidth, kHeight, escape(c.title), body, legend);
}

std::string toggle(const char* what, const char* label) {
  return fmt::format(R"(<label><input type="checkbox" onchange="this.closest('figure').dataset.{}=this.checked?1:0"> {}</label>)",
                     what, label);
}

}  // namespace

std::vector<size_t> thin(const std::vector<double>& y, size_t max_points) {
  std::vector<size_t> keep;
  const size_t n = y.size();
  if (n <= max_points || max_points < 4) {
    for (size_t i = 0; i < n; ++i) keep.push_back(i);
    return keep;
  }
  const size_t buckets = (max_points - 2) / 2;
  keep.push_back(0);
  for (size_t b = 0; b < buckets; ++b) {
    const size_t from = 1 + (n - 2) * b / buckets, to = 1 + (n - 2) * (b + 1) / buckets;
    if (from >= to) continue;
    // The stretch's finite minimum and maximum, and its first non-finite value (a skipped step's
    // loss), which charts leave a gap for: each kept, in order.
    size_t lo = to, hi = to, odd = to;
    for (size_t i = from; i < to; ++i) {
      if (!std::isfinite(y[i])) {
        if (odd == to) odd = i;
        continue;
      }
      if (lo == to || y[i] < y[lo]) lo = i;
      if (hi == to || y[i] > y[hi]) hi = i;
    }
    std::vector<size_t> picked;
    for (size_t i : {lo, hi, odd})
      if (i != to) picked.push_back(i);
    std::sort(picked.begin(), picked.end());
    picked.erase(std::unique(picked.begin(), picked.end()), picked.end());
    keep.insert(keep.end(), picked.begin(), picked.end());
  }
  keep.push_back(n - 1);
  return keep;
}

std::vector<double> smooth(const std::vector<double>& y, double weight) {
  std::vector<double> out(y.size());
  double average = 0, norm = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (!std::isfinite(y[i])) {
      out[i] = y[i];
      continue;
    }
    average = weight * average + (1 - weight) * y[i];
    norm = weight * norm + (1 - weight);
    out[i] = average / norm;
  }
  return out;
}

std::string line_chart(const Chart& c, const std::vector<Series>& series, size_t max_points) {
  Range x, lin, log;
  for (const auto& s : series) {
    for (size_t i = 0; i < s.y.size(); ++i) {
      if (!std::isfinite(s.y[i])) continue;
      x.add(s.x[i]), lin.add(s.y[i]);
      if (s.y[i] > 0) log.add(std::log10(s.y[i]));
    }
  }
  if (x.empty()) return "";
  const bool with_log = c.log_toggle && !log.empty();
  std::string body = x_axis(c, Scale{x.usable(), lin.usable()});
  for (const bool is_log : {false, true}) {
    if (is_log && !with_log) continue;
    const Scale sc{x.usable(), is_log ? log.usable() : lin.usable(), is_log};
    const char* variant = is_log ? "log" : "lin";
    body += y_axis(c, sc, variant);
    for (const auto& s : series) {
      if (s.markers) {
        body += markers(s, sc, variant);
        continue;
      }
      body += polyline(s, s.y, sc, max_points, is_log ? "log raw" : "lin raw");
      if (c.smooth_toggle) body += polyline(s, smooth(s.y), sc, max_points, is_log ? "log smooth" : "lin smooth");
    }
  }
  std::string toggles;
  if (with_log) toggles += toggle("log", "log scale");
  if (c.smooth_toggle) toggles += toggle("smooth", "smoothed");
  return figure(c, toggles, body, series);
}

std::string stacked_chart(const Chart& c, const std::vector<Series>& parts, size_t max_points) {
  if (parts.empty() || parts[0].x.empty()) return "";
  const size_t n = parts[0].x.size();
  std::vector<std::vector<double>> top(parts.size(), std::vector<double>(n));
  for (size_t p = 0; p < parts.size(); ++p)
    for (size_t i = 0; i < n; ++i) top[p][i] = (p == 0 ? 0 : top[p - 1][i]) + (i < parts[p].y.size() ? parts[p].y[i] : 0);
  Range x, y;
  y.add(0);
  for (size_t i = 0; i < n; ++i) x.add(parts[0].x[i]), y.add(top.back()[i]);
  const Scale sc{x.usable(), y.usable()};
  std::string body = x_axis(c, sc) + y_axis(c, sc, "lin");
  const auto keep = thin(top.back(), max_points);
  for (size_t p = 0; p < parts.size(); ++p) {
    std::string points;
    for (size_t i : keep) points += fmt::format("{:.1f},{:.1f} ", sc.px(parts[0].x[i]), sc.py(top[p][i]));
    for (auto it = keep.rbegin(); it != keep.rend(); ++it)
      points += fmt::format("{:.1f},{:.1f} ", sc.px(parts[0].x[*it]), sc.py(p == 0 ? 0 : top[p - 1][*it]));
    points.pop_back();
    body += fmt::format(R"(<polygon class="area" data-series="{}" data-recorded="{}" fill="{}" points="{}"/>)", escape(parts[p].name),
                        parts[p].y.size(), parts[p].color, points);
  }
  return figure(c, "", body, parts);
}

std::string gantt_chart(const Chart& c, const std::vector<std::string>& rows, const std::vector<Span>& spans) {
  if (spans.empty()) return "";
  Range x;
  for (const auto& s : spans) x.add(s.start), x.add(s.end);
  const Scale sc{x.usable(), Range{0, 1}};
  const double lane = kPlotH / static_cast<double>(std::max<size_t>(rows.size(), 1));
  std::string body = x_axis(c, sc);
  body += "<g class=\"axis y lin\">";
  for (size_t r = 0; r < rows.size(); ++r)
    body += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="end">{}</text>)", kLeft - 6, kTop + lane * (r + 0.5) + 4,
                        escape(rows[r]));
  body += "</g><g class=\"spans\">";
  for (const auto& s : spans) {
    const double x0 = sc.px(s.start), w = std::max(sc.px(s.end) - x0, 0.5), y0 = kTop + lane * s.row + 2;
    body += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="{}"><title>{}</title></rect>)", x0, y0, w,
                        lane - 4, s.color, escape(s.label));
    if (w > 7.0 * static_cast<double>(s.label.size()))
      body += fmt::format(R"(<text class="in" x="{:.1f}" y="{:.1f}" text-anchor="middle">{}</text>)", x0 + w / 2, y0 + lane / 2 + 2,
                          escape(s.label));
  }
  return figure(c, "", body + "</g>", {});
}

std::string escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += ch;
    }
  }
  return out;
}

std::vector<double> nice_ticks(double lo, double hi, int count) {
  std::vector<double> ticks;
  if (!(hi > lo) || count < 1) return {lo};
  const double raw = (hi - lo) / count;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double unit = raw / mag;
  const double step = (unit < 1.5 ? 1 : unit < 3 ? 2 : unit < 7 ? 5 : 10) * mag;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  return ticks;
}

std::string tick_label(double v) {
  const double a = std::abs(v);
  if (a >= 1e9) return fmt::format("{:g}G", v / 1e9);
  if (a >= 1e6) return fmt::format("{:g}M", v / 1e6);
  if (a >= 1e4) return fmt::format("{:g}k", v / 1e3);
  return fmt::format("{:.4g}", v);
}

}  // namespace zeroth::report
