"""The page around the reports: Airflow 3's look (its Chakra palette, light and dark), tables, links, forms.

Server-rendered and self-contained: the styles are inline, there is no script, and every value
is escaped here, where it meets HTML. ``prefers-color-scheme`` picks the dark palette, as
Airflow's own "system" colour mode does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from html import escape
from urllib.parse import urlencode

import msgspec

CSS = """
:root{--bg:#fff;--fg:#1a202c;--muted:#718096;--line:#e2e8f0;--head:#f7fafc;--accent:#0077b6;--chip:#edf2f7;
--delete:#c53030;--report:#b7791f;--ok:#2f855a;font-family:Inter,-apple-system,"Segoe UI",Roboto,sans-serif}
@media (prefers-color-scheme:dark){:root{--bg:#101014;--fg:#e4e4e7;--muted:#a1a1aa;--line:#2e2e35;--head:#18181d;
--accent:#63b3ed;--chip:#27272a;--delete:#fc8181;--report:#f6e05e;--ok:#68d391}}
body{background:var(--bg);color:var(--fg);margin:0;font-size:14px;line-height:1.45}
header{display:flex;gap:18px;align-items:center;padding:10px 20px;
border-bottom:1px solid var(--line);background:var(--head)}
header b{font-size:16px}main{padding:14px 20px}
a{color:var(--accent);text-decoration:none}a:hover{text-decoration:underline}
h1{font-size:20px;margin:4px 0 12px}h2{font-size:16px;margin:18px 0 8px}h3{font-size:14px;margin:12px 0 6px}
table{border-collapse:collapse;width:100%;font-size:13px}th,td{border-bottom:1px solid var(--line);padding:5px 8px;
text-align:left;vertical-align:top}th{background:var(--head);font-weight:600;white-space:nowrap}
tr:hover td{background:var(--head)}.muted{color:var(--muted)}.num{text-align:right}
.chip{display:inline-block;background:var(--chip);border-radius:10px;padding:0 8px;font-size:12px}
table.needs td:first-child{color:var(--delete)}p.ok{color:var(--ok);font-weight:600}
.a-delete{color:var(--delete);font-weight:600}.a-report{color:var(--report);font-weight:600}.a-keep{color:var(--ok)}
form.filters{display:flex;flex-wrap:wrap;gap:8px;align-items:end;margin:8px 0}
form.filters label{display:flex;flex-direction:column;font-size:12px;color:var(--muted)}
input,select,button{background:var(--bg);color:var(--fg);border:1px solid var(--line);border-radius:4px;padding:4px 6px}
button{background:var(--accent);color:var(--bg);border:0;cursor:pointer}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(420px,1fr));gap:10px}
figure.chart{margin:0;border:1px solid var(--line);border-radius:6px;padding:8px}
figcaption{font-weight:600;font-size:13px}
svg{width:100%;height:auto}svg .axis,svg .grid{stroke:var(--line)}svg .tick{fill:var(--muted);font-size:10px}
svg .hit{fill:transparent}svg a:hover .hit,svg g.col:hover .hit{fill:var(--chip)}
.legend{display:flex;flex-wrap:wrap;gap:10px;font-size:12px}.legend i{display:inline-block;width:10px;height:10px;
margin-right:4px;border-radius:2px}dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:3px 14px;margin:0}
dt{color:var(--muted)}dd{margin:0}nav.pager{display:flex;gap:12px;align-items:center;margin:8px 0}
details summary{cursor:pointer;color:var(--muted)}code{font-size:12px}
"""


def text(value: object) -> str:
    """A value as escaped text; None, or a field a record never had (``UNSET``), as nothing."""
    return escape("" if value is None or value is msgspec.UNSET else str(value))


def link(href: str, label: object, **attrs: str) -> str:
    extra = "".join(f' {k.replace("_", "-")}="{escape(v)}"' for k, v in attrs.items())
    return f'<a href="{escape(href)}"{extra}>{text(label)}</a>'


def query(base: str, params: Mapping[str, object]) -> str:
    """``base`` with the non-empty ``params`` as its query string."""
    kept = {k: v for k, v in params.items() if v not in (None, "")}
    return f"{base}?{urlencode(kept)}" if kept else base


def action(value: str) -> str:
    return f'<span class="a-{text(value)}">{text(value)}</span>'


def table(headers: Iterable[str], rows: Iterable[Iterable[str]], *, css: str = "") -> str:
    """A table of cells that are already HTML (escape them with :func:`text`); ``headers`` are HTML too."""
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def facts(pairs: Iterable[tuple[str, str]]) -> str:
    """A definition list of (label, HTML) pairs."""
    return '<dl class="facts">' + "".join(f"<dt>{text(k)}</dt><dd>{v}</dd>" for k, v in pairs) + "</dl>"


def document(title: str, body: str, nav: Iterable[tuple[str, str]] = ()) -> str:
    """A whole page: the title, a header with ``nav`` (href, label) links, and the body."""
    links = "".join(link(href, label) for href, label in nav)
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{text(title)}</title>'
        '<meta name="color-scheme" content="light dark">'
        f"<style>{CSS}</style></head><body><header><b>Reaper</b>{links}</header><main>{body}</main></body></html>"
    )
