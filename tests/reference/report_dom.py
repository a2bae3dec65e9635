#!/usr/bin/env python3
"""Reads the DOM Chromium rendered of a zeroth run report (`chromium --headless --dump-dom`) with
Python's own HTML parser and prints what it holds, for tests/tools/report_test.cc to compare with
the run's metrics.jsonl:

    /usr/bin/python3 tests/reference/report_dom.py DOM.html

One JSON object: {"figures": {id: {"axes": {"x": n, "y": n}, "lines": [{"series", "classes",
"recorded", "drawn", "points"}], "markers": [{"series", "classes", "recorded", "circles"}],
"areas": n, "rects": n}}, "sections": [id, ...], "title": text}.
"""
import json
import sys
from html.parser import HTMLParser


class Report(HTMLParser):
    def __init__(self):
        super().__init__()
        self.figures, self.sections, self.title = {}, [], ""
        self.figure, self.markers, self.in_title = None, None, False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = a.get("class", "").split()
        if tag == "section" and "id" in a:
            self.sections.append(a["id"])
        if tag == "title":
            self.in_title = True
        if tag == "figure" and "chart" in classes:
            self.figure = self.figures.setdefault(a["id"], {"axes": {"x": 0, "y": 0}, "lines": [], "markers": [], "areas": 0, "rects": 0})
        if self.figure is None:
            return
        if tag == "g" and "axis" in classes:
            for axis in ("x", "y"):
                self.figure["axes"][axis] += axis in classes
        if tag == "polyline":
            pts = a.get("points", "").split()
            self.figure["lines"].append({"series": a.get("data-series"), "classes": classes, "recorded": int(a["data-recorded"]),
                                         "drawn": int(a["data-drawn"]), "points": len(pts)})
        if tag == "g" and "markers" in classes:
            self.markers = {"series": a.get("data-series"), "classes": classes, "recorded": int(a["data-recorded"]), "circles": 0}
            self.figure["markers"].append(self.markers)
        if tag == "circle" and self.markers is not None:
            self.markers["circles"] += 1
        if tag == "polygon" and "area" in classes:
            self.figure["areas"] += 1
        if tag == "rect":
            self.figure["rects"] += 1

    def handle_endtag(self, tag):
        if tag == "figure":
            self.figure = None
        if tag == "g":
            self.markers = None
        if tag == "title":
            self.in_title = False

    def handle_data(self, data):
        if self.in_title and self.figure is None:
            self.title += data


def main(path):
    r = Report()
    r.feed(open(path, encoding="utf-8").read())
    print(json.dumps({"figures": r.figures, "sections": r.sections, "title": r.title}))


if __name__ == "__main__":
    main(sys.argv[1])
