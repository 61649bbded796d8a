"""Questions as readers ask them, stored the way the chat service stores them, for the report's tests and bench.

Three out-of-scope subjects the demo book never covers (bread baking, football, mortgages) are
declined; the demo book's own questions are answered (some rated down); rows are written with SQL in the
shape ``Store.start_exchange`` + ``finish_message`` leave (question row, then answer row, same session).
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]

BREAD = [
    "How long should I proof sourdough bread before baking?",
    "What flour is best for baking bread at home?",
    "Why is my homemade bread so dense?",
    "How do I feed a sourdough starter?",
    "What oven temperature gives a crusty loaf of bread?",
    "Can I bake bread without yeast?",
    "How much water should go into a bread dough?",
    "How do I knead bread dough properly?",
    "Why did my sourdough loaf not rise?",
    "How do I get an open crumb in sourdough bread?",
]
FOOTBALL = [
    "Who won the football World Cup in 2018?",
    "How many players are on a soccer team?",
    "What is the offside rule in football?",
    "Which football club has won the most Champions League titles?",
    "How long is a professional soccer match?",
    "Who scored the most goals in World Cup history?",
    "When is the next FIFA World Cup?",
    "How does a penalty shootout work in football?",
]
MONEY = [
    "Should I choose a fixed or variable mortgage rate?",
    "How big a deposit do I need for a mortgage?",
    "What credit score do I need to get a mortgage?",
    "Is it worth remortgaging when interest rates fall?",
    "How is the monthly payment on a mortgage calculated?",
    "Can I pay off my mortgage early without a penalty?",
]
_PREFIXES = ("", "Quick question: ", "Sorry if this is off topic, but ", "Hi! ")


def book_questions() -> list[tuple[str, str]]:
    """(question, module) of the demo book's answerable questions."""
    path = ROOT / "examples" / "textbook" / "questions.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(r["question"], r["module"]) for r in rows if r["kind"] == "answerable"]


def phrasings(base: Sequence[str], count: int, rng: random.Random) -> list[str]:
    """``count`` questions drawn from ``base`` (each at least once), some with a reader's preamble."""
    chosen = list(base) + [rng.choice(base) for _ in range(max(0, count - len(base)))]
    out = []
    for text in chosen[:count]:
        prefix = rng.choice(_PREFIXES)
        out.append(prefix + (text[0].lower() + text[1:] if prefix.endswith("but ") else text))
    rng.shuffle(out)
    return out


@dataclass(frozen=True)
class Asked:
    question: str
    module: str | None = None
    model: str = "extractive"  # "decline" for a declined question
    confidence: float | None = 0.8
    feedback: str | None = None
    mode: str = "textbook"
    cites: tuple[tuple[str, str, str], ...] = ()  # (title, url, module) given as sources; [1].. cited in text
    days_ago: float = 0.0
    idle_days: float | None = None  # the session's last activity, days ago (default: days_ago)


def insert(conn: psycopg.Connection[object], asked: Sequence[Asked], *, now: datetime | None = None) -> None:
    """One session per question (readers mostly ask once), written in a few statements."""
    now = now or datetime.now(UTC)
    sessions: list[tuple[object, ...]] = []
    messages: list[tuple[object, ...]] = []
    citations: list[tuple[object, ...]] = []
    for a in asked:
        sid, qid, aid = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
        at = now - timedelta(days=a.days_ago)
        idle = now - timedelta(days=a.idle_days if a.idle_days is not None else a.days_ago)
        sessions.append((sid, "h", at, idle))
        declined = a.model == "decline"
        content = (
            "The book does not cover this." if declined else " ".join(f"See [{i + 1}]." for i in range(len(a.cites)))
        )
        messages.append((qid, sid, "user", a.question, a.mode, a.module, None, None, None, at))
        messages.append(
            (
                aid,
                sid,
                "assistant",
                content,
                a.mode,
                a.module,
                a.confidence,
                a.model,
                a.feedback,
                at + timedelta(seconds=2),
            )
        )
        for position, (title, url, module) in enumerate(a.cites, 1):
            citations.append((uuid.uuid4(), aid, position, f"chunk-{position}", module, title, url))
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO chat_sessions (id, token_hash, created_at, last_activity_at) VALUES (%s, %s, %s, %s)", sessions
        )
        cur.executemany(
            """
            INSERT INTO chat_messages
                (id, session_id, role, content, mode, module_filter, confidence, model, feedback, created_at)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
            """,
            messages,
        )
        cur.executemany(
            "INSERT INTO source_citations (id, message_id, position, chunk_id, module, title, url) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s)",
            citations,
        )
    conn.commit()


def reader_month(rng: random.Random, *, scale: int = 1, days: int = 30) -> list[Asked]:
    """A month of questions: answered book questions, three declined subjects (30, 20, 12 x scale), thumbs-down."""
    asked: list[Asked] = []
    book = book_questions()
    for i in range(200 * scale):
        question, module = book[i % len(book)]
        asked.append(
            Asked(
                question,
                module=module if i % 3 == 0 else None,
                confidence=0.75 if i % 10 else 0.5,
                feedback="up" if i % 7 == 0 else ("down" if i % 25 == 3 else None),
                mode="selection" if i % 9 == 0 else "textbook",
                cites=((f"Section {i % 5}", f"https://book.example/docs/s{i % 5}", module),),
                days_ago=rng.uniform(0, days - 1),
            )
        )
    for subject, count in ((BREAD, 30), (FOOTBALL, 20), (MONEY, 12)):
        for question in phrasings(subject, count * scale, rng):
            asked.append(Asked(question, model="decline", confidence=0.1, days_ago=rng.uniform(0, days - 1)))
    return asked
