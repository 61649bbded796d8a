"""Question and conversation sets asked through the public API, as a reader's client (and the issues' checks) ask.

    .venv/bin/python -m bench.public_api --data-dir DIR SET.jsonl [SET.jsonl ...] [--compare] [--json PATH]

DIR holds one book's index (``python -m textbook_chat ingest BOOK``, self-calibrated as ingest does). The server
runs as ``serve`` runs with no model configured (the local embedder, the second opinion, the offline answer), on a
scratch Postgres database; every question is a ``POST /api/chat`` read as a browser's EventSource reads it. A hit is
a section the reader is shown: the ``sources`` event, best first (on a decline, the closest sections it offers).

- A question set: each question in a new session (a module_filter question with its module, a selection with its
  text); ``eval``'s retrieval table, and the offline answers' facts where the set gives them.
- A conversation set: each conversation in one session (the server reads its earlier turns from Postgres, answers
  included, as it does for any reader), each later turn also asked alone and as its hand rewrite, each in a new
  session; ``eval``'s conversation table and the answers' facts.

``--compare`` first runs ``eval``'s own in-process reading of each set on the same index (before the server holds
it) and lists every question or turn whose decision, or rank where it answered, differs between the two: the API
should add nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import alembic_config, create_database, drop_database
from tests.servers import server_process
from tests.sse_client import answer_text, of_type, read_all
from textbook_chat.answer import facts
from textbook_chat.search import conversations, evaluate

# The server's own limits raised, so a set of a few hundred questions measures answers, not refusals.
SERVER_ENV = {
    "EMBEDDER": "local",
    "OPENAI_API_KEY": "",
    "STREAM_SIGNING_KEY": "bench-signing-key",
    "RATE_LIMIT_ANON": "1000000/hour",
    "RATE_LIMIT_READ": "1000000/minute",
    "MAX_STREAMS_PER_CLIENT": "100000",
    "SESSION_DAILY_TOKENS": "1000000000",
    "LOG_LEVEL": "warning",
}
TIMEOUT_S = 120.0  # one answer, however loaded the machine


@dataclass(frozen=True)
class Reply:
    """What a reader's client sees of one answer."""

    files: tuple[str, ...]  # the sections shown (``sources``), best first
    declined: bool
    confidence: float
    level: str
    text: str
    retrieval_ms: float
    session: dict[str, str]  # what continues its conversation
    searched: str  # "module" or "all" (``meta.scope``)
    opinion: str | None  # what the second opinion changed ("kept" where it changed nothing), None: not asked


class Reader:
    """One client of the server at ``url``."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def ask(self, question: str, session: dict[str, str] | None = None, **fields: str | None) -> Reply:
        body: dict[str, Any] = {"question": question, **(session or {})}
        body.update({k: v for k, v in fields.items() if v})
        before = await self.opinions()
        stream = await read_all(self.client, "POST", "/api/chat", json=body)
        after = await self.opinions()
        changed = [change for change, count in after.items() if count > before.get(change, 0.0)]
        (meta,) = of_type(stream, "meta")
        (done,) = of_type(stream, "done")
        shown = [s for event in of_type(stream, "sources") for s in event["sources"]]
        kept = dict(session or {})
        if "session_token" in meta:
            kept = {"session_id": meta["session_id"], "session_token": meta["session_token"]}
        return Reply(
            files=tuple(str(s["file_path"]) for s in shown),
            declined=done["finish_reason"] == "declined",
            confidence=float(meta["confidence"]),
            level=str(meta["confidence_level"]),
            text=answer_text(stream),
            retrieval_ms=float(done.get("timings_ms", {}).get("retrieval", 0.0)),
            session=kept,
            searched=str(meta.get("scope", {}).get("searched", "")),
            opinion=changed[0] if changed else None,
        )

    async def opinions(self) -> dict[str, float]:
        """The server's count of questions its cross-encoder read, by what it changed (``/metrics``): read
        before and after one question, the difference says whether it was asked and what it did."""
        counts: dict[str, float] = {}
        for line in (await self.client.get("/metrics")).text.splitlines():
            if line.startswith(_OPINIONS):
                change = line[len(_OPINIONS) :].split('"', 1)[0]
                counts[change] = float(line.rsplit(" ", 1)[1])
        return counts


_OPINIONS = 'textbook_second_opinions_total{change="'


def ranked(files: Sequence[str], wanted: set[str]) -> int | None:
    return next((n for n, f in enumerate(files[:5], start=1) if f in wanted), None)


async def ask_questions(reader: Reader, questions: Sequence[evaluate.Question]) -> list[tuple[evaluate.Outcome, str]]:
    """Each question in a new session, as ``eval`` asks it (a module filter only on module_filter questions)."""
    outcomes = []
    for q in questions:
        module = q.module if q.kind == "module_filter" else None
        selected = q.selected_text if q.kind == "selection" else None
        reply = await reader.ask(q.question, module=module, selected_text=selected)
        wanted = set(q.expected_files) or ({q.source_file} if q.source_file else set())
        outcome = evaluate.Outcome(
            id=q.id,
            kind=q.kind,
            confidence=reply.confidence,
            similarity=0.0,
            level=reply.level,
            declined=reply.declined,
            rank=ranked(reply.files, wanted),
            files=reply.files,
            searched=reply.searched,
            decision=None,
            expected=("module" if q.in_filter else "all") if q.kind == "module_filter" else None,
            second_opinion=reply.opinion,
            retrieval_ms=reply.retrieval_ms,
        )
        outcomes.append((outcome, "" if reply.declined else reply.text))
    return outcomes


async def ask_conversations(
    reader: Reader, sets: Sequence[conversations.Conversation]
) -> list[conversations.TurnOutcome]:
    """Each conversation in one session; its later turns also alone and as their rewrite, in new sessions."""
    outcomes = []
    for conversation in sets:
        session: dict[str, str] = {}
        for number, turn in enumerate(conversation.turns, start=1):
            reply = await reader.ask(turn.question, session, module=turn.module)
            session = reply.session
            in_context = _asking(turn, reply)
            alone = in_context if number == 1 else _asking(turn, await reader.ask(turn.question, module=turn.module))
            rewrite = None
            if turn.standalone and number > 1:
                rewrite = _asking(turn, await reader.ask(turn.standalone, module=turn.module))
            said = "" if reply.declined else reply.text
            outcomes.append(conversations.TurnOutcome(conversation.id, number, turn, in_context, alone, rewrite, said))
    return outcomes


def _asking(turn: conversations.Turn, reply: Reply) -> conversations.Asking:
    return conversations.Asking(ranked(reply.files, set(turn.expected_files)), reply.declined, reply.retrieval_ms)


@dataclass
class Results:
    questions: dict[str, list[tuple[evaluate.Outcome, str]]]
    turns: dict[str, list[conversations.TurnOutcome]]


async def through_api(data_dir: Path, paths: Sequence[Path], log: Path) -> Results:
    results = Results({}, {})
    async with _server(data_dir, log) as url, httpx.AsyncClient(base_url=url, timeout=TIMEOUT_S) as client:
        reader = Reader(client)
        for path in paths:
            if conversations.is_conversation_set(path):
                results.turns[str(path)] = await ask_conversations(reader, conversations.load(path))
            else:
                results.questions[str(path)] = await ask_questions(reader, evaluate.load_questions(path))
    return results


@asynccontextmanager
async def _server(data_dir: Path, log: Path) -> AsyncIterator[str]:
    from alembic import command

    database = create_database("textbook_bench")
    try:
        command.upgrade(alembic_config(database), "head")
        env = {**SERVER_ENV, "DATABASE_URL": database, "DATA_DIR": str(data_dir)}
        async with server_process(env, log) as (_, url):
            yield url
    finally:
        drop_database(database)


async def in_process(data_dir: Path, paths: Sequence[Path]) -> Results:
    """``eval``'s own reading of each set (retrieval in this process, the offline answer as history)."""
    from textbook_chat.answer.generation import offline_generator
    from textbook_chat.core.settings import Settings
    from textbook_chat.search import calibration
    from textbook_chat.search.retrieval import Retriever
    from textbook_chat.search.second_opinion import SecondOpinion
    from textbook_chat.web.services import open_services

    results = Results({}, {})
    settings = Settings.from_env({"DATA_DIR": str(data_dir), "EMBEDDER": "local", "LOG_LEVEL": "warning"})
    async with open_services(settings, retrieval=True) as services:
        index, embedder = services.index, services.embedder
        assert index is not None and embedder is not None
        opinion = SecondOpinion.load(await calibration.stored_thresholds(index, embedder))
        try:
            retriever = Retriever(index, embedder, await calibration.stored(index, embedder), opinion)
            answer = facts.offline_answer(offline_generator(opinion.encoder, wait_s=math.inf))
            for path in paths:
                if conversations.is_conversation_set(path):
                    results.turns[str(path)] = await conversations.run(retriever, conversations.load(path), answer)
                else:
                    outcomes = await evaluate.run(retriever, evaluate.load_questions(path))
                    results.questions[str(path)] = [(o, "") for o in outcomes]
        finally:
            opinion.close()
    return results


def differences(api: Results, local: Results) -> list[str]:
    """Every question or turn whose rank or decline differs between the API and ``eval`` in process."""
    lines = []
    for name, asked in api.questions.items():
        for (theirs, _), (ours, _) in zip(asked, local.questions.get(name, []), strict=False):
            if _differ(theirs.rank, theirs.declined, ours.rank, ours.declined):
                lines.append(
                    f"{theirs.id}: API rank {theirs.rank} declined {theirs.declined}; "
                    f"eval rank {ours.rank} declined {ours.declined}"
                )
    for name, turns in api.turns.items():
        for theirs_turn, ours_turn in zip(turns, local.turns.get(name, []), strict=False):
            a, b = theirs_turn.in_context, ours_turn.in_context
            if _differ(a.rank, a.declined, b.rank, b.declined):
                lines.append(
                    f"{theirs_turn.conversation}#{theirs_turn.number}: API rank {a.rank} declined "
                    f"{a.declined}; eval rank {b.rank} declined {b.declined}"
                )
    return lines


def _differ(api_rank: int | None, api_declined: bool, rank: int | None, declined: bool) -> bool:
    """A different decision, or a different rank of an answer (a decline shows the closest sections, where ``eval``
    ranks the top five candidates: those ranks differ by design)."""
    return api_declined != declined or (not declined and api_rank != rank)


def report(results: Results) -> str:
    parts = []
    for name, asked in results.questions.items():
        parts.append(evaluate.table(evaluate.figures([o for o, _ in asked]), title=f"{name} (through the API)"))
        with_facts = {q.id: q for q in evaluate.load_questions(Path(name)) if q.answer_facts}
        scored = [
            facts.score(o.id, o.kind, text, with_facts[o.id].answer_facts) for o, text in asked if o.id in with_facts
        ]
        if scored:
            parts.append(facts.table(facts.figures(scored)))
    for name, turns in results.turns.items():
        parts.append(conversations.table(turns, title=f"{name} (through the API)"))
        parts.append(facts.conversation_table(turns))
    return "\n\n".join(p for p in parts if p)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sets", type=Path, nargs="+", help="question sets and conversation sets of the book")
    parser.add_argument("--data-dir", type=Path, required=True, help="DATA_DIR holding the book's index")
    parser.add_argument("--compare", action="store_true", help="also run eval in process and list differences")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write every outcome")
    args = parser.parse_args()
    local = asyncio.run(in_process(args.data_dir, args.sets)) if args.compare else None
    with tempfile.TemporaryDirectory(prefix="public-api-") as tmp:
        log = Path(tmp) / "server.log"
        try:
            results = asyncio.run(through_api(args.data_dir, args.sets, log))
        except Exception:
            print(log.read_text()[-3000:] if log.exists() else "(no server log)")
            raise
    print(report(results))
    if local is not None:
        found = differences(results, local)
        print(f"\nthrough the API and in process: {len(found)} differences")
        print("\n".join(found))
    if args.json is not None:
        args.json.write_text(json.dumps(_json(results), indent=1), encoding="utf-8")


def _json(results: Results) -> dict[str, Any]:
    from dataclasses import asdict

    return {
        "questions": {name: [asdict(o) for o, _ in asked] for name, asked in results.questions.items()},
        "turns": {name: [asdict(t) for t in turns] for name, turns in results.turns.items()},
    }


if __name__ == "__main__":
    main()
