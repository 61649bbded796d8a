"""The authors' report: what readers ask that the book does not answer (gaps), and how the book is used.

Everything comes from Postgres. A *gap* is a question whose answer was declined, came with low
confidence, or was rated down. Gap questions are grouped into topics by meaning (``textbook_chat.reports.topics``,
over the configured embedder's vectors, cached in ``question_vectors``), largest first, each with
its most telling words, up to three example questions, the book's closest sections (where an author
would add the missing text) and a count per day. Purged sessions leave their numbers behind
(``question_days``, ``gap_topics``/``gap_topic_days``; see ``retention.fold``), so trends outlive retention while
readers' words do not: examples come only from sessions still inside retention, and the report never
carries session ids, user ids, tokens or addresses. The question rows come from ``questions.py``.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

import numpy as np
import psycopg

from textbook_chat.index.embeddings import Embedder
from textbook_chat.reports import questions as asked
from textbook_chat.reports import topics
from textbook_chat.reports.questions import Question
from textbook_chat.search.retrieval import Retriever

log = logging.getLogger(__name__)

MAX_TOPICS = 25  # topics listed; the rest are counted in ``more_topics``
SECTIONS_FOR = 12  # topics (the largest) that get their closest sections looked up
EXAMPLES = 3
MAX_DAYS = 3660
_NEAR_COPY = 0.9  # cosine above which two example questions say the same thing

# Sections whose [n] marker the answer really used (a source listed but never cited does not count).
_CITED_SQL = """
SELECT c.title, c.url, c.module, count(*) AS citations
FROM source_citations c JOIN chat_messages a ON a.id = c.message_id
WHERE a.created_at >= %(since)s AND a.created_at < %(until)s AND a.role = 'assistant'
  AND strpos(a.content, '[' || c.position || ']') > 0
GROUP BY c.title, c.url, c.module
ORDER BY citations DESC, c.url
LIMIT 10
"""


@dataclass(frozen=True, slots=True)
class Section:
    title: str
    module: str | None
    url: str
    score: float


@dataclass(slots=True)
class Topic:
    label: str
    questions: int
    declined: int
    low: int
    rated_down: int
    examples: list[str]
    sections: list[Section]
    trend: list[int]  # questions per day, one entry per day of the period, oldest first
    purged_only: bool = False  # known only from purged sessions' counts: no examples left


@dataclass(frozen=True, slots=True)
class ModuleUse:
    module: str
    questions: int
    gaps: int
    up: int
    down: int

    @property
    def up_rate(self) -> float | None:
        rated = self.up + self.down
        return self.up / rated if rated else None


@dataclass(slots=True)
class Report:
    generated_at: datetime
    since: date
    until: date
    questions: int
    gaps: int
    selection: int
    per_day: list[tuple[date, int, int]]  # (day, questions, gaps)
    modules: list[ModuleUse]
    levels: dict[str, int]  # high / medium / low / declined / unanswered
    cited: list[tuple[str, str, str | None, int]]  # (title, url, module, citations)
    topics: list[Topic]
    more_topics: int = 0  # topics beyond MAX_TOPICS (each smaller than the last listed)
    notes: list[str] = field(default_factory=list)

    @property
    def days(self) -> list[date]:
        return [row[0] for row in self.per_day]

    @property
    def selection_share(self) -> float:
        return self.selection / self.questions if self.questions else 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["generated_at"] = self.generated_at.isoformat()
        data["since"], data["until"] = self.since.isoformat(), self.until.isoformat()
        data["selection_share"] = round(self.selection_share, 4)
        data["per_day"] = [{"day": d.isoformat(), "questions": q, "gaps": g} for d, q, g in self.per_day]
        data["modules"] = [
            {**asdict(m), "up_rate": None if m.up_rate is None else round(m.up_rate, 4)} for m in self.modules
        ]
        data["cited"] = [{"title": t, "url": u, "module": m, "citations": n} for t, u, m, n in self.cited]
        return data


def period_days(value: str) -> int:
    """``30d`` or ``30`` -> 30 (1 to 3660 days); ValueError with a sentence otherwise."""
    text = value.strip().lower().removesuffix("d")
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_DAYS:
        raise ValueError(f"{value[:20]!r} is not a period: expected a number of days such as 30d (1 to {MAX_DAYS})")
    return int(text)


async def build(
    conn: psycopg.AsyncConnection[Any],
    embedder: Embedder,
    *,
    days: int = 30,
    retention_days: int = 30,
    retriever: Retriever | None = None,
    now: datetime | None = None,
) -> Report:
    """The report for the last ``days`` days (today included), from one connection."""
    now = now or datetime.now(UTC)
    until_day = now.date()
    since_day = until_day - timedelta(days=days - 1)
    since = datetime.combine(since_day, datetime.min.time(), UTC)
    until = datetime.combine(until_day + timedelta(days=1), datetime.min.time(), UTC)
    retained = now - timedelta(days=retention_days)
    period = [since_day + timedelta(days=i) for i in range(days)]

    questions = await asked.read(conn, since, until, retained)
    per_day_q: Counter[date] = Counter(q.day for q in questions)
    per_day_g: Counter[date] = Counter(q.day for q in questions if q.reasons)
    by_module: dict[str, list[Question]] = defaultdict(list)
    for q in questions:
        by_module[q.module].append(q)
    levels = Counter(q.level for q in questions)
    total, gaps, selection = len(questions), sum(per_day_g.values()), sum(q.selection for q in questions)

    folded_days = await _folded_days(conn, since_day, until_day)
    module_counts: dict[str, list[int]] = {
        m: [len(qs), sum(1 for q in qs if q.reasons), sum(q.feedback == "up" for q in qs)]
        for m, qs in by_module.items()
    }
    down_counts = {m: sum(q.feedback == "down" for q in qs) for m, qs in by_module.items()}
    for day, module, n, g, s in folded_days:
        per_day_q[day] += n
        per_day_g[day] += g
        total, gaps, selection = total + n, gaps + g, selection + s
        counts = module_counts.setdefault(module, [0, 0, 0])
        counts[0] += n
        counts[1] += g
    modules = sorted(
        (ModuleUse(m, c[0], c[1], c[2], down_counts.get(m, 0)) for m, c in module_counts.items()),
        key=lambda m: (-m.questions, m.module),
    )

    async with conn.cursor() as cur:
        await cur.execute(_CITED_SQL, {"since": since, "until": until})
        cited = [(str(t or url), str(url), module, int(n)) for t, url, module, n in await cur.fetchall()]

    report = Report(
        generated_at=now,
        since=since_day,
        until=until_day,
        questions=total,
        gaps=gaps,
        selection=selection,
        per_day=[(d, per_day_q[d], per_day_g[d]) for d in period],
        modules=modules,
        levels={k: levels.get(k, 0) for k in ("high", "medium", "low", "declined", "unanswered")},
        cited=cited,
        topics=[],
    )
    await _gap_topics(conn, embedder, retriever, report, [q for q in questions if q.reasons], period)
    return report


async def _folded_days(
    conn: psycopg.AsyncConnection[Any], since: date, until: date
) -> list[tuple[date, str, int, int, int]]:
    async with conn.cursor() as cur:
        await cur.execute(
            "SELECT day, module, questions, gaps, selection FROM question_days WHERE day BETWEEN %s AND %s",
            (since, until),
        )
        return [(d, m, int(n), int(g), int(s)) for d, m, n, g, s in await cur.fetchall()]


async def _gap_topics(
    conn: psycopg.AsyncConnection[Any],
    embedder: Embedder,
    retriever: Retriever | None,
    report: Report,
    gaps: list[Question],
    period: list[date],
) -> None:
    index_of_day = {d: i for i, d in enumerate(period)}
    vectors = await asked.vectors_for(conn, embedder, [q.id for q in gaps], [q.text for q in gaps])
    grouping = topics.group(vectors) if gaps else topics.Grouping([], [])
    members: dict[int, list[int]] = defaultdict(list)
    for i, label in enumerate(grouping.labels):
        members[label].append(i)
    found: list[Topic] = []
    centroids: list[np.ndarray[Any, np.dtype[np.float32]]] = []
    names = topics.labels([q.text for q in gaps], grouping.labels, grouping.count)
    for topic_no in range(grouping.count):
        rows = [gaps[i] for i in members[topic_no]]
        centre = grouping.centroids[topic_no]
        trend = [0] * len(period)
        for q in rows:
            trend[index_of_day[q.day]] += 1
        found.append(
            Topic(
                label=names[topic_no],
                questions=len(rows),
                declined=sum("declined" in q.reasons for q in rows),
                low=sum("low" in q.reasons for q in rows),
                rated_down=sum("rated_down" in q.reasons for q in rows),
                examples=_examples(rows, vectors[members[topic_no]], centre),
                sections=[],
                trend=trend,
            )
        )
        centroids.append(centre)
    await _add_purged_topics(conn, embedder, report, found, centroids, period)
    found.sort(key=lambda t: (-t.questions, t.label))
    report.topics, report.more_topics = found[:MAX_TOPICS], max(0, len(found) - MAX_TOPICS)
    if retriever is None:
        report.notes.append("closest sections not looked up: the book's index is not open here")
        return
    for topic in report.topics[:SECTIONS_FOR]:
        probe = topic.examples[0] if topic.examples else topic.label.replace(" · ", " ")
        topic.sections = await _closest_sections(retriever, probe)


def _examples(
    rows: Sequence[Question], vectors: np.ndarray[Any, np.dtype[np.float32]], centre: np.ndarray[Any, Any]
) -> list[str]:
    """Up to three questions from sessions inside retention: the most typical first, then ones that say it
    differently (a near-copy of one already chosen is skipped)."""
    order = np.argsort(-(vectors @ centre), kind="stable")
    chosen: list[int] = []
    for i in (int(i) for i in order):
        if not rows[i].retained or not rows[i].text.strip():
            continue
        if any(float(vectors[i] @ vectors[j]) > _NEAR_COPY for j in chosen):
            continue
        chosen.append(i)
        if len(chosen) == EXAMPLES:
            break
    return [rows[i].text if len(rows[i].text) <= 300 else rows[i].text[:297] + "..." for i in chosen]


async def _add_purged_topics(
    conn: psycopg.AsyncConnection[Any],
    embedder: Embedder,
    report: Report,
    found: list[Topic],
    centroids: list[np.ndarray[Any, np.dtype[np.float32]]],
    period: list[date],
) -> None:
    """Fold the purged sessions' topic counts in: into the live topic they match, or as topics of their own."""
    index_of_day = {d: i for i, d in enumerate(period)}
    async with conn.cursor() as cur:
        await cur.execute(
            """
            SELECT t.id, t.label, t.centroid, d.day, d.questions
            FROM gap_topics t JOIN gap_topic_days d ON d.topic_id = t.id
            WHERE t.model = %s AND d.day BETWEEN %s AND %s
            ORDER BY t.id, d.day
            """,
            (asked.embedder_key(embedder), period[0], period[-1]),
        )
        rows = await cur.fetchall()
    if not rows:
        return
    purged: dict[uuid.UUID, tuple[str, bytes, list[tuple[date, int]]]] = {}
    for tid, label, centroid, day, n in rows:
        purged.setdefault(tid, (label, bytes(centroid), []))[2].append((day, int(n)))
    ids = list(purged)
    matrix = np.stack([np.frombuffer(purged[t][1], dtype=np.float32) for t in ids])
    matches = topics.assign(matrix, centroids)
    for tid, match in zip(ids, matches, strict=True):
        label, _, counts = purged[tid]
        if match < 0:
            found.append(Topic(label, 0, 0, 0, 0, [], [], [0] * len(period), purged_only=True))
            centroids.append(np.frombuffer(purged[tid][1], dtype=np.float32))
            match = len(found) - 1
        topic = found[match]
        for day, n in counts:
            topic.trend[index_of_day[day]] += n
            topic.questions += n


async def _closest_sections(retriever: Retriever, probe: str) -> list[Section]:
    try:
        result = await retriever.retrieve(probe)
    except Exception as exc:  # a report without sections beats no report; the reason is logged
        log.warning("closest sections unavailable: %s", type(exc).__name__)
        return []
    sections: list[Section] = []
    seen: set[str] = set()
    for source in (*result.candidates, *result.sources, *result.related):
        if source.url in seen:
            continue
        seen.add(source.url)
        sections.append(Section(source.title, source.module, source.url, round(source.score, 4)))
        if len(sections) == 3:
            break
    return sections
