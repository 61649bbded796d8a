"""The authors' report: what readers ask that the book does not answer (gaps), and how the book is used.

Everything comes from Postgres. A *gap* is a question whose answer was declined, came with low
confidence, or was rated down. Gap questions are grouped into topics by meaning (``server.reports.topics``,
over the configured embedder's vectors, cached in ``question_vectors``), largest first, each with
its most telling words, up to three example questions, the book's closest sections (where an author
would add the missing text) and a count per day. Purged sessions leave their numbers behind
(``question_days``, ``gap_topics``/``gap_topic_days``; see ``fold``), so trends outlive retention while
readers' words do not: examples come only from sessions still inside retention, and the report never
carries session ids, user ids, tokens or addresses.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any, Literal

import numpy as np
import psycopg

from server.index.embeddings import Embedder
from server.reports import topics
from server.search import confidence
from server.search.retrieval import Retriever

log = logging.getLogger(__name__)

Reason = Literal["declined", "low", "rated_down"]
MAX_TOPICS = 25  # topics listed; the rest are counted in ``more_topics``
SECTIONS_FOR = 12  # topics (the largest) that get their closest sections looked up
EXAMPLES = 3
MAX_DAYS = 3660
_NEAR_COPY = 0.9  # cosine above which two example questions say the same thing
_EMBED_BATCH = 256

# One row per question in the period, with what became of its answer (the next message of its session).
_QUESTIONS_SQL = """
WITH pairs AS (
    SELECT m.id, m.session_id, m.role, m.created_at, m.mode, m.module_filter,
           lead(m.role) OVER w AS next_role, lead(m.model) OVER w AS model,
           lead(m.confidence) OVER w AS confidence, lead(m.feedback) OVER w AS feedback
    FROM chat_messages m
    WHERE m.created_at >= %(since)s AND m.created_at < %(until)s
      AND (%(sessions)s::uuid[] IS NULL OR m.session_id = ANY(%(sessions)s::uuid[]))
    WINDOW w AS (PARTITION BY m.session_id ORDER BY m.created_at, m.role DESC)
)
SELECT p.id, p.created_at, p.mode, p.module_filter,
       CASE WHEN p.next_role = 'assistant' THEN p.model END AS model,
       CASE WHEN p.next_role = 'assistant' THEN p.confidence END AS confidence,
       CASE WHEN p.next_role = 'assistant' THEN p.feedback END AS feedback,
       s.last_activity_at >= %(retained)s AS retained
FROM pairs p JOIN chat_sessions s ON s.id = p.session_id
WHERE p.role = 'user'
ORDER BY p.created_at
"""

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


@dataclass(slots=True)
class _Question:
    id: uuid.UUID
    day: date
    module: str
    selection: bool
    level: str
    feedback: str | None
    retained: bool
    reasons: tuple[Reason, ...]
    text: str = ""


def period_days(value: str) -> int:
    """``30d`` or ``30`` -> 30 (1 to 3660 days); ValueError with a sentence otherwise."""
    text = value.strip().lower().removesuffix("d")
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_DAYS:
        raise ValueError(f"{value[:20]!r} is not a period: expected a number of days such as 30d (1 to {MAX_DAYS})")
    return int(text)


def gap_reasons(model: str | None, confidence_value: float | None, feedback: str | None) -> tuple[Reason, ...]:
    """Why a question counts as a gap: its answer was declined, had low confidence, or was rated down."""
    reasons: list[Reason] = []
    if model == "decline":
        reasons.append("declined")
    elif confidence_value is not None and confidence.level(confidence_value) == "low":
        reasons.append("low")
    if feedback == "down":
        reasons.append("rated_down")
    return tuple(reasons)


def answer_level(model: str | None, confidence_value: float | None) -> str:
    if model == "decline":
        return "declined"
    if confidence_value is None:
        return "unanswered"  # failed, interrupted, or still streaming
    return confidence.level(confidence_value)


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

    questions = await _questions(conn, since, until, retained)
    per_day_q: Counter[date] = Counter(q.day for q in questions)
    per_day_g: Counter[date] = Counter(q.day for q in questions if q.reasons)
    by_module: dict[str, list[_Question]] = defaultdict(list)
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


async def _questions(
    conn: psycopg.AsyncConnection[Any],
    since: datetime,
    until: datetime,
    retained: datetime,
    *,
    sessions: Sequence[uuid.UUID] | None = None,
) -> list[_Question]:
    """Every question asked in [since, until) (of ``sessions`` only, when given), the gap ones with their text."""
    rows: list[_Question] = []
    params = {"since": since, "until": until, "retained": retained, "sessions": list(sessions) if sessions else None}
    async with conn.cursor() as cur:
        await cur.execute(_QUESTIONS_SQL, params)
        async for qid, created, mode, module, model, conf, feedback, keep in cur:
            rows.append(
                _Question(
                    id=qid,
                    day=created.astimezone(UTC).date(),
                    module=module or "",
                    selection=mode == "selection",
                    level=answer_level(model, conf),
                    feedback=feedback,
                    retained=bool(keep),
                    reasons=gap_reasons(model, conf, feedback),
                )
            )
    gap_ids = [q.id for q in rows if q.reasons]
    if gap_ids:
        async with conn.cursor() as cur:
            await cur.execute("SELECT id, content FROM chat_messages WHERE id = ANY(%s)", (gap_ids,))
            texts = dict(await cur.fetchall())
        for q in rows:
            if q.reasons:
                q.text = texts.get(q.id, "")
    return rows


async def _folded_days(
    conn: psycopg.AsyncConnection[Any], since: date, until: date
) -> list[tuple[date, str, int, int, int]]:
    async with conn.cursor() as cur:
        await cur.execute(
            "SELECT day, module, questions, gaps, selection FROM question_days WHERE day BETWEEN %s AND %s",
            (since, until),
        )
        return [(d, m, int(n), int(g), int(s)) for d, m, n, g, s in await cur.fetchall()]


async def vectors_for(
    conn: psycopg.AsyncConnection[Any],
    embedder: Embedder,
    ids: Sequence[uuid.UUID],
    texts: Sequence[str],
    *,
    cache: bool = True,
) -> np.ndarray[Any, np.dtype[np.float32]]:
    """The embedder's vectors of these questions: cached ones read, the rest embedded (each text once) and cached.

    Writes go through the caller's transaction (the pool's connection block commits them).
    """
    if not ids:
        return np.zeros((0, 0), dtype=np.float32)
    model = embedder_key(embedder)
    async with conn.cursor() as cur:
        await cur.execute(
            "SELECT message_id, vector FROM question_vectors WHERE message_id = ANY(%s) AND model = %s",
            (list(ids), model),
        )
        cached = {mid: bytes(vec) for mid, vec in await cur.fetchall()}
    missing = [i for i, mid in enumerate(ids) if mid not in cached]
    distinct = list(dict.fromkeys(texts[i] for i in missing))
    fresh: dict[str, bytes] = {}
    for start in range(0, len(distinct), _EMBED_BATCH):
        batch = distinct[start : start + _EMBED_BATCH]
        for text, vector in zip(batch, await embedder.embed_documents(batch), strict=True):
            fresh[text] = np.asarray(vector, dtype=np.float32).tobytes()
    for i in missing:
        cached[ids[i]] = fresh[texts[i]]
    if missing and cache:
        async with conn.cursor() as cur:
            await cur.executemany(
                "INSERT INTO question_vectors (message_id, model, vector) VALUES (%s, %s, %s) "
                "ON CONFLICT (message_id) DO UPDATE SET model = EXCLUDED.model, vector = EXCLUDED.vector",
                [(ids[i], model, cached[ids[i]]) for i in missing],
            )
    return np.stack([np.frombuffer(cached[mid], dtype=np.float32) for mid in ids])


def embedder_key(embedder: Embedder) -> str:
    return f"{embedder.name}:{getattr(embedder, 'model', '')}"


async def _gap_topics(
    conn: psycopg.AsyncConnection[Any],
    embedder: Embedder,
    retriever: Retriever | None,
    report: Report,
    gaps: list[_Question],
    period: list[date],
) -> None:
    index_of_day = {d: i for i, d in enumerate(period)}
    vectors = await vectors_for(conn, embedder, [q.id for q in gaps], [q.text for q in gaps])
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
    rows: Sequence[_Question], vectors: np.ndarray[Any, np.dtype[np.float32]], centre: np.ndarray[Any, Any]
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
            (embedder_key(embedder), period[0], period[-1]),
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


async def fold(
    conn: psycopg.AsyncConnection[Any], embedder: Embedder, session_ids: Sequence[uuid.UUID]
) -> tuple[int, int]:
    """Keep the numbers of these sessions' questions, not their words, before the sessions are deleted.

    Daily totals per module go to ``question_days``; gap questions are grouped into topics, each matched
    to a topic kept by an earlier purge (by centre) or kept as a new one (its label and centre, no text),
    and counted per day in ``gap_topic_days``. Runs inside the caller's transaction. Returns
    (questions, gap questions) folded.
    """
    if not session_ids:
        return 0, 0
    first, last = datetime(1970, 1, 1, tzinfo=UTC), datetime(9999, 1, 1, tzinfo=UTC)  # all their questions
    questions = await _questions(conn, first, last, retained=last, sessions=session_ids)
    totals: Counter[tuple[date, str]] = Counter((q.day, q.module) for q in questions)
    gap_totals: Counter[tuple[date, str]] = Counter((q.day, q.module) for q in questions if q.reasons)
    selections: Counter[tuple[date, str]] = Counter((q.day, q.module) for q in questions if q.selection)
    gaps = [q for q in questions if q.reasons]
    if totals:
        async with conn.cursor() as cur:
            await cur.executemany(
                """
                INSERT INTO question_days (day, module, questions, gaps, selection) VALUES (%s, %s, %s, %s, %s)
                ON CONFLICT (day, module) DO UPDATE SET questions = question_days.questions + EXCLUDED.questions,
                    gaps = question_days.gaps + EXCLUDED.gaps, selection = question_days.selection + EXCLUDED.selection
                """,
                [(d, m, n, gap_totals[(d, m)], selections[(d, m)]) for (d, m), n in totals.items()],
            )
    if gaps:
        await _fold_topics(conn, embedder, gaps)
    return len(questions), len(gaps)


async def _fold_topics(conn: psycopg.AsyncConnection[Any], embedder: Embedder, gaps: list[_Question]) -> None:
    words = [q.text for q in gaps]
    vectors = await vectors_for(conn, embedder, [q.id for q in gaps], words, cache=False)  # the rows are about to go
    grouping = topics.group(vectors)
    model = embedder_key(embedder)
    async with conn.cursor() as cur:
        await cur.execute("SELECT id, centroid FROM gap_topics WHERE model = %s ORDER BY created_at, id", (model,))
        known = [(tid, np.frombuffer(bytes(c), dtype=np.float32)) for tid, c in await cur.fetchall()]
    matches = topics.assign(np.stack(grouping.centroids), [c for _, c in known]) if known else []
    names = topics.labels(words, grouping.labels, grouping.count)
    topic_ids: list[uuid.UUID] = []
    for topic_no, centre in enumerate(grouping.centroids):
        if known and matches[topic_no] >= 0:
            topic_ids.append(known[matches[topic_no]][0])
            continue
        topic_ids.append(uuid.uuid4())
        async with conn.cursor() as cur:
            await cur.execute(
                "INSERT INTO gap_topics (id, model, label, centroid) VALUES (%s, %s, %s, %s)",
                (topic_ids[-1], model, names[topic_no], centre.tobytes()),
            )
    counts: Counter[tuple[uuid.UUID, date]] = Counter(
        (topic_ids[topic_no], gaps[i].day) for i, topic_no in enumerate(grouping.labels) if topic_no >= 0
    )
    async with conn.cursor() as cur:
        await cur.executemany(
            """
            INSERT INTO gap_topic_days (topic_id, day, questions) VALUES (%s, %s, %s)
            ON CONFLICT (topic_id, day) DO UPDATE SET questions = gap_topic_days.questions + EXCLUDED.questions
            """,
            [(tid, day, n) for (tid, day), n in counts.items()],
        )
