"""The report as a terminal table and as one self-contained HTML page (inline SVG, no network, light and dark)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from textbook_chat.core.text import for_terminal
from textbook_chat.reports.report import Report, Topic

_LEVEL_NAMES = {
    "high": "confident",
    "medium": "fairly sure",
    "low": "unsure",
    "declined": "declined",
    "unanswered": "no answer (failed or stopped)",
}
_REASONS = (("declined", "declined"), ("low", "low confidence"), ("rated_down", "rated down"))


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f} %" if whole else "-"


def _reasons(topic: Topic) -> str:
    parts = [f"{getattr(topic, key)} {name}" for key, name in _REASONS if getattr(topic, key)]
    return ", ".join(parts) or ("from purged sessions" if topic.purged_only else "")


# -- terminal -------------------------------------------------------------------------------------


def text(report: Report) -> str:
    up = sum(m.up for m in report.modules)
    down = sum(m.down for m in report.modules)
    lines = [
        f"Textbook Chat report, {report.since} to {report.until}",
        "",
        f"questions            {report.questions}",
        f"gaps                 {report.gaps} ({_percent(report.gaps, report.questions)})",
        f"selection mode       {report.selection} ({_percent(report.selection, report.questions)})",
        f"thumbs up / down     {up} / {down}",
        "",
        "What readers ask that the book does not answer (largest first)",
    ]
    if not report.topics:
        lines.append("  (no gaps in this period)")
    for number, topic in enumerate(report.topics, 1):
        lines.append(f"{number:>3}. {topic.label}  [{topic.questions}: {_reasons(topic)}]  trend {_spark(topic.trend)}")
        lines += [f"       - {example}" for example in topic.examples]
        lines += [f"       > {s.title} ({s.module or '-'}) {s.url}" for s in topic.sections]
    if report.more_topics:
        lines.append(f"     ... and {report.more_topics} smaller topic(s)")
    lines += ["", "Answers by confidence"]
    width = max(len(name) for name in _LEVEL_NAMES.values())
    lines += [f"  {_LEVEL_NAMES[k]:<{width}}  {v:>7}" for k, v in report.levels.items()]
    lines += ["", "Modules                               questions     gaps   up   down"]
    for m in report.modules:
        lines.append(
            f"  {(m.module or '(whole book)')[:34]:<34}  {m.questions:>9}  {m.gaps:>7}  {m.up:>3}  {m.down:>5}"
        )
    lines += ["", "Most cited sections"]
    lines += [f"  {n:>5}  {title} ({module or '-'})" for title, _url, module, n in report.cited] or ["  (none)"]
    lines += ["", f"Questions per day: {_spark([q for _, q, _ in report.per_day])}"]
    lines += [f"note: {note}" for note in report.notes]
    # Readers wrote the questions shown here: none of their characters may drive the operator's terminal.
    return "\n".join(for_terminal(line) for line in lines)


def _spark(values: Sequence[int]) -> str:
    bars = " ▁▂▃▄▅▆▇█"
    top = max(values, default=0)
    if not top:
        return "·" * min(len(values), 60)
    step = max(1, len(values) // 60)
    sampled = [sum(values[i : i + step]) for i in range(0, len(values), step)]
    top = max(sampled)
    return "".join(bars[min(8, round(8 * v / top))] if v else "·" for v in sampled)


# -- HTML -----------------------------------------------------------------------------------------

_CSS = """
:root { color-scheme: light dark; --bg: #fbfbfd; --card: #ffffff; --ink: #1c1e21; --muted: #5f6670;
  --line: #e3e6ea; --accent: #2e7d6b; --gap: #c2553d; --soft: #e8f3f0; }
@media (prefers-color-scheme: dark) { :root { --bg: #16181b; --card: #1f2226; --ink: #e7e9ec;
  --muted: #a0a7b0; --line: #30353b; --accent: #5cc2a6; --gap: #ef8a6f; --soft: #23342f; } }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--ink); font: 15px/1.5 system-ui, -apple-system, "Segoe UI",
  Roboto, sans-serif; }
main { max-width: 1040px; margin: 0 auto; padding: 32px 20px 64px; }
h1 { font-size: 26px; margin: 0 0 4px; } h2 { font-size: 19px; margin: 36px 0 12px; }
.muted { color: var(--muted); } a { color: var(--accent); }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(180px, 1fr)); gap: 12px; margin-top: 20px; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 10px; padding: 14px 16px;
  overflow-x: auto; min-width: 0; }
.big { font-size: 28px; font-weight: 650; } .topic { margin-bottom: 12px; }
.topic header { display: flex; gap: 12px; align-items: baseline; justify-content: space-between; flex-wrap: wrap; }
.topic h3 { margin: 0; font-size: 17px; } .count { font-weight: 650; color: var(--gap); white-space: nowrap; }
.bar { height: 6px; background: var(--line); border-radius: 3px; margin: 8px 0; overflow: hidden; }
.bar span { display: block; height: 100%; background: var(--gap); }
ul { margin: 6px 0; padding-left: 20px; } li { margin: 2px 0; overflow-wrap: anywhere; }
.cols { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; }
@media (max-width: 700px) { .cols { display: block; } }
table { border-collapse: collapse; width: 100%; } .cols > section { min-width: 0; }
td, th { padding: 6px 8px; border-bottom: 1px solid var(--line);
  text-align: left; } td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
svg text { fill: var(--muted); font-size: 11px; }
.legend i { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin: 0 4px 0 12px; }
"""


def html(report: Report) -> str:
    up = sum(m.up for m in report.modules)
    down = sum(m.down for m in report.modules)
    cards = [
        ("questions", str(report.questions), f"{report.since} to {report.until}"),
        ("gaps", str(report.gaps), f"{_percent(report.gaps, report.questions)} declined, unsure or rated down"),
        ("selection mode", _percent(report.selection, report.questions), "asked about highlighted text"),
        ("thumbs up", _percent(up, up + down), f"{up} up, {down} down"),
    ]
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>Reader questions report, {report.since} to {report.until}</title><style>{_CSS}</style></head>",
        "<body><main>",
        "<h1>What readers ask</h1>",
        f"<div class='muted'>{report.since} to {report.until} · "
        f"generated {report.generated_at:%Y-%m-%d %H:%M} UTC</div>",
        "<div class='cards'>",
        *(
            f"<div class='card'><div class='muted'>{escape(n)}</div><div class='big'>{escape(v)}</div>"
            f"<div class='muted'>{escape(d)}</div></div>"
            for n, v, d in cards
        ),
        "</div>",
        "<h2>Questions per day</h2>",
        _day_chart(report),
        "<h2>What the book does not answer</h2>",
        "<p class='muted'>Questions that were declined, answered with low confidence or rated down, grouped by "
        "meaning, largest first. The sections listed are the book's closest: where the missing text would go.</p>",
        *(_topic_html(number, topic, report) for number, topic in enumerate(report.topics, 1)),
        "<p class='muted'>No gaps in this period.</p>" if not report.topics else "",
        f"<p class='muted'>and {report.more_topics} smaller topic(s)</p>" if report.more_topics else "",
        "<div class='cols'><section><h2>Answers by confidence</h2>",
        _levels_chart(report),
        "</section><section><h2>Most cited sections</h2>",
        _cited_html(report),
        "</section></div>",
        "<h2>Modules</h2>",
        _modules_html(report),
        *(f"<p class='muted'>Note: {escape(note)}</p>" for note in report.notes),
        "</main></body></html>",
    ]
    return "\n".join(part for part in parts if part)


def _topic_html(number: int, topic: Topic, report: Report) -> str:
    largest = max(t.questions for t in report.topics) or 1
    examples = "".join(f"<li>{escape(e)}</li>" for e in topic.examples)
    sections = "".join(
        f"<li><a href='{escape(s.url)}'>{escape(s.title)}</a> <span class='muted'>{escape(s.module or '')}</span></li>"
        for s in topic.sections
    )
    return (
        "<article class='card topic'><header>"
        f"<h3>{number}. {escape(topic.label)}</h3>"
        f"<span class='count'>{topic.questions} question{'s' if topic.questions != 1 else ''}</span></header>"
        f"<div class='bar'><span style='width:{100 * topic.questions / largest:.1f}%'></span></div>"
        f"<div class='muted'>{escape(_reasons(topic))}</div>"
        f"{_sparkline(topic.trend)}"
        + (f"<div>Asked as:</div><ul>{examples}</ul>" if examples else "")
        + (f"<div>Closest sections:</div><ul>{sections}</ul>" if sections else "")
        + "</article>"
    )


def _sparkline(values: Sequence[int], width: int = 240, height: int = 28) -> str:
    top = max(values, default=0) or 1
    n = max(1, len(values))
    step = width / n
    bars = "".join(
        f"<rect x='{i * step:.1f}' y='{height - height * v / top:.1f}' width='{max(step - 1, 1):.1f}' "
        f"height='{height * v / top:.1f}' fill='var(--gap)'/>"
        for i, v in enumerate(values)
        if v
    )
    return f"<svg role='img' aria-label='questions per day' width='{width}' height='{height}'>{bars}</svg>"


def _day_chart(report: Report, width: int = 1000, height: int = 160) -> str:
    values = report.per_day
    top = max((q for _, q, _ in values), default=0) or 1
    step = width / max(1, len(values))
    bars = []
    for i, (day, questions, gaps) in enumerate(values):
        x = i * step
        h_q, h_g = (height - 40) * questions / top, (height - 40) * gaps / top
        bars.append(
            f"<g><title>{day}: {questions} questions, {gaps} gaps</title>"
            f"<rect x='{x:.1f}' y='{height - 20 - h_q:.1f}' width='{max(step - 2, 1):.1f}' height='{h_q:.1f}' "
            "fill='var(--accent)' opacity='0.75'/>"
            f"<rect x='{x:.1f}' y='{height - 20 - h_g:.1f}' width='{max(step - 2, 1):.1f}' height='{h_g:.1f}' "
            "fill='var(--gap)'/></g>"
        )
    first, last = (values[0][0], values[-1][0]) if values else ("", "")
    return (
        f"<div class='card'><svg role='img' aria-label='questions and gaps per day' viewBox='0 0 {width} {height}' "
        f"width='100%'>{''.join(bars)}<text x='0' y='{height - 4}'>{first}</text>"
        f"<text x='{width}' y='{height - 4}' text-anchor='end'>{last}</text>"
        f"<text x='0' y='12'>{top} per day</text></svg>"
        "<div class='legend muted'><i style='background:var(--accent);opacity:.75'></i>questions"
        "<i style='background:var(--gap)'></i>gaps</div></div>"
    )


def _levels_chart(report: Report) -> str:
    total = sum(report.levels.values()) or 1
    colours = {
        "high": "var(--accent)",
        "medium": "#7fb7a8",
        "low": "#e0a458",
        "declined": "var(--gap)",
        "unanswered": "var(--line)",
    }
    rows = []
    for i, (level, count) in enumerate(report.levels.items()):
        w = 260 * count / total
        rows.append(
            f"<text x='0' y='{i * 26 + 15}'>{escape(_LEVEL_NAMES[level])}</text>"
            f"<rect x='190' y='{i * 26 + 4}' width='{w:.1f}' height='14' rx='3' fill='{colours[level]}'/>"
            f"<text x='{196 + w:.1f}' y='{i * 26 + 15}'>{count}</text>"
        )
    return (
        f"<div class='card'><svg role='img' aria-label='answers by confidence' viewBox='0 0 500 {26 * len(rows)}' "
        f"width='100%'>{''.join(rows)}</svg></div>"
    )


def _cited_html(report: Report) -> str:
    if not report.cited:
        return "<div class='card muted'>No citations in this period.</div>"
    rows = "".join(
        f"<tr><td><a href='{escape(url)}'>{escape(title)}</a> <span class='muted'>{escape(module or '')}</span></td>"
        f"<td class='n'>{n}</td></tr>"
        for title, url, module, n in report.cited
    )
    return f"<div class='card'><table><tr><th>section</th><th class='n'>cited</th></tr>{rows}</table></div>"


def _modules_html(report: Report) -> str:
    rows = "".join(
        f"<tr><td>{escape(m.module or 'whole book')}</td><td class='n'>{m.questions}</td><td class='n'>{m.gaps}</td>"
        f"<td class='n'>{_percent(m.gaps, m.questions)}</td><td class='n'>{m.up} / {m.down}</td>"
        f"<td class='n'>{'-' if m.up_rate is None else f'{100 * m.up_rate:.0f} %'}</td></tr>"
        for m in report.modules
    )
    return (
        "<div class='card'><table><tr><th>module asked in</th><th class='n'>questions</th><th class='n'>gaps</th>"
        "<th class='n'>gap share</th><th class='n'>up / down</th><th class='n'>thumbs up</th></tr>"
        f"{rows}</table></div>"
    )
