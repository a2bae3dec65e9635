"""Renders chat templates as Hugging Face's apply_chat_template does, the reference zeroth's Jinja
interpreter is checked against: jinja2's ImmutableSandboxedEnvironment with trim_blocks,
lstrip_blocks and loop controls, its tojson (json.dumps, ensure_ascii off), raise_exception and
{% generation %}. Here a generation block's output is bracketed by two sentinel characters, which
are then taken out and their places reported as byte offsets of the UTF-8 text.

stdin: {"templates": [{"name", "source"}], "cases": [{"variables": {...}}]}
stdout: {"results": [[{"text", "generation"} or {"error"} per case] per template]}
"""
import json
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

OPEN, CLOSE = "\x02", "\x03"


class Generation(Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(lineno)

    def _mark(self, caller):
        return OPEN + caller() + CLOSE


class Raised(jinja2.exceptions.TemplateError):
    """What the template raised itself, whose words zeroth must give too."""


def raise_exception(message):
    raise Raised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def render(template, variables):
    text = template.render(**variables)
    out, spans, start = bytearray(), [], None
    for ch in text:
        if ch == OPEN:
            start = len(out)
        elif ch == CLOSE:
            spans.append([start, len(out)])
        else:
            out += ch.encode("utf-8")
    return {"text": out.decode("utf-8"), "generation": spans}


def main():
    request = json.load(sys.stdin)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    results = []
    for t in request["templates"]:
        try:
            template = env.from_string(t["source"])
        except jinja2.exceptions.TemplateError as e:
            results.append([{"error": str(e)}] * len(request["cases"]))
            continue
        row = []
        for case in request["cases"]:
            try:
                row.append(render(template, case["variables"]))
            except Raised as e:
                row.append({"error": str(e), "raised": True})
            except (jinja2.exceptions.TemplateError, TypeError, ValueError) as e:  # the template's own errors
                row.append({"error": f"{type(e).__name__}: {e}"})
        results.append(row)
    json.dump({"results": results}, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
