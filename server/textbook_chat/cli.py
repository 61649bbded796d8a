"""``textbook-chat COMMAND`` (the installed command) and ``python -m textbook_chat COMMAND`` (from a checkout): a thin
dispatcher; each command calls one function of another module.

User mistakes (a bad setting, a missing database URL) print one line and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from textbook_chat import __version__
from textbook_chat.core import logs, onnx_minilm, private, resources, tokens
from textbook_chat.core.errors import AppError
from textbook_chat.core.settings import Settings, SettingsError

if TYPE_CHECKING:
    from textbook_chat.index.embeddings import Embedder
    from textbook_chat.index.vectors import VectorIndex
    from textbook_chat.search.retrieval import Retriever

_T = TypeVar("_T")
_REPORT_TIMEOUT_S = 600.0  # the report reads every question of the period and may embed the new ones


class UsageError(Exception):
    """A mistake by whoever ran the command; printed as one line."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
        logs.configure(settings.log_level, "text" if args.command != "serve" else settings.log_format)
        _prepare(args, settings)
        if settings.metrics_dir is not None:
            # prometheus-client opens its files there as soon as a metric is defined (any command that counts).
            settings.metrics_dir.mkdir(parents=True, exist_ok=True)
        result: int = args.run(args, settings)
        return result
    except (SettingsError, UsageError, AppError, onnx_minilm.ModelUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _prepare(args: argparse.Namespace, settings: Settings) -> None:
    """What every command needs before it runs: where the data is (said when the installed command picked the
    per-user folder itself), tiktoken's files, and the MiniLM weights (installed on first use). The commands
    that write readers' data or the index (the report's files hold readers' questions) create only private files,
    whatever the umask (core/private.py)."""
    files = resources.current()
    if files.installed and settings.data_dir == files.default_data_dir:
        print(f"textbook-chat: DATA_DIR is not set; data is kept in {settings.data_dir}", file=sys.stderr)
    if args.command in ("serve", "ingest", "calibrate", "eval", "report"):
        os.umask(private.UMASK)
    tokens.configure_tiktoken_cache(settings.data_dir, files.tiktoken)
    if args.command != "migrate":  # every other command embeds or counts with MiniLM's tokenizer
        onnx_minilm.ensure_installed(lambda message: print(f"textbook-chat: {message}", file=sys.stderr))


def _prog() -> str:
    """How the user called us, for usage lines: the installed command, or ``python -m textbook_chat`` in a checkout."""
    called = Path(sys.argv[0]).stem if sys.argv else ""
    return resources.APP_NAME if called == resources.APP_NAME else "python -m textbook_chat"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=_prog(), description="Textbook Chat server and tools.")
    parser.add_argument("--version", action="version", version=__version__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the HTTP server (uvicorn)")
    serve.add_argument("--host", default="127.0.0.1", help="interface to bind (default: %(default)s)")
    serve.add_argument("--port", type=int, default=8000, help="port to bind (default: %(default)s)")
    serve.add_argument("--workers", type=int, default=1, help="worker processes (default: %(default)s)")
    serve.add_argument("--book", type=Path, default=None, help="ingest this book incrementally at start (BOOK_PATH)")
    serve.set_defaults(run=_serve)

    ingest = commands.add_parser("ingest", help="index a Docusaurus book (incremental by content hash)")
    ingest.add_argument("path", type=Path, help="the book's folder (containing docs/) or its docs folder")
    ingest.add_argument("--dry-run", action="store_true", help="say what would change without writing")
    ingest.add_argument("--force", action="store_true", help="drop the collection and re-embed everything")
    ingest.set_defaults(run=_ingest)

    migrate = commands.add_parser("migrate", help="upgrade the Postgres schema to the newest revision")
    migrate.add_argument("--to", default="head", metavar="REVISION", help="target revision (default: head)")
    migrate.add_argument("--downgrade", action="store_true", help="downgrade to --to instead (e.g. --to base)")
    migrate.set_defaults(run=_migrate)

    purge = commands.add_parser("purge", help="delete sessions idle longer than SESSION_RETENTION_DAYS")
    purge.add_argument("--days", type=int, default=None, help="override SESSION_RETENTION_DAYS")
    purge.add_argument("--batch-size", type=int, default=1000, help="sessions per transaction (default: 1000)")
    purge.set_defaults(run=_purge)

    report = commands.add_parser("report", help="what readers ask that the book does not answer, and how it is used")
    report.add_argument("--since", default="30d", metavar="DAYS", help="the period, e.g. 7d or 90d (default: 30d)")
    report.add_argument("--html", type=Path, default=None, metavar="PATH", help="also write the report as one page")
    report.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write its figures as JSON")
    report.set_defaults(run=_report)

    evaluate = commands.add_parser(
        "eval", help="measure retrieval on a question set (hit@k, MRR, declines, scope) and the offline answer's facts"
    )
    evaluate.add_argument("questions", type=Path, help="a question set or a conversation set (docs/evaluation.md)")
    evaluate.add_argument("--misses", action="store_true", help="with a conversation set: list the turns missed")
    evaluate.add_argument("--module-aware", action="store_true", help="ask answerable questions within their module")
    evaluate.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the figures as JSON")
    evaluate.add_argument("--plot", type=Path, default=None, metavar="PATH", help="draw confidence histograms (PNG)")
    evaluate.add_argument("--calibrate", action="store_true", help="derive a calibration from these questions")
    evaluate.add_argument("--no-second-opinion", action="store_true", help="decide without the cross-encoder")
    evaluate.add_argument(
        "--save", action="store_true", help="with --calibrate: keep that calibration with the index (serve uses it)"
    )
    evaluate.set_defaults(run=_eval)

    calibrate = commands.add_parser(
        "calibrate", help="derive the confidence calibration from the indexed book again, and show its evidence"
    )
    calibrate.set_defaults(run=_calibrate)
    return parser


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    """uvicorn with the app factory; SIGTERM drains first (web/drain.py), then uvicorn's own shutdown runs."""
    import uvicorn

    if args.workers < 1:
        raise UsageError("--workers must be at least 1")
    if args.workers > 1 and not settings.redis_url:
        raise UsageError("--workers > 1 needs REDIS_URL: streams, resume and rate limits are shared through Redis")
    if args.workers > 1 and not settings.qdrant_url:
        raise UsageError("--workers > 1 needs a Qdrant server (QDRANT_URL): the embedded index allows one process")
    if args.book is not None:
        book = args.book.expanduser().resolve()
        if not book.is_dir():
            raise UsageError(f"--book {args.book}: no such folder")
        # Worker processes read their settings from the environment, so the flag travels that way.
        os.environ["BOOK_PATH"] = str(book)
    from textbook_chat.store import embedded_db
    from textbook_chat.web.sockets import SocketGuard

    private.prepare_data_dir(settings.data_dir)

    with _metrics_dir(settings, args.workers), embedded_db.database(settings) as settings:
        if settings.database_url:
            os.environ["DATABASE_URL"] = settings.database_url  # the app (and every worker) reads the environment
        # uvicorn re-raises the SIGTERM/SIGINT it caught once it has shut down; ending with SystemExit instead of
        # the signal's default action lets this block stop the embedded Postgres (and run other cleanups).
        for stop in (signal.SIGTERM, signal.SIGINT):
            signal.signal(stop, _exit_on_signal)
        uvicorn.run(
            "textbook_chat.web.app:create_app",
            factory=True,
            # Header and body read deadlines and a cap per peer on unfinished requests (web/sockets.py).
            http=SocketGuard.for_this_process(settings).protocol(),
            ws="none",  # no route is a WebSocket: an upgrade request is answered as plain HTTP
            host=args.host,
            port=args.port,
            workers=args.workers,
            log_config=None,
            proxy_headers=False,  # client addresses come from TRUSTED_PROXIES, not from uvicorn
            # Answers have had SHUTDOWN_GRACE_S by the time uvicorn shuts down (web/drain.py): what is left is
            # sending their last events and closing idle connections.
            timeout_graceful_shutdown=SHUTDOWN_FLUSH_S,
        )
    return 0


SHUTDOWN_FLUSH_S = 5


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _metrics_dir(settings: Settings, workers: int) -> Iterator[None]:
    """A fresh PROMETHEUS_MULTIPROC_DIR for this run: the operator's (emptied), or a temporary one for N workers.

    prometheus-client reads the variable when a process imports it, so it must be set before the workers start,
    and this process must not import ``core.metrics`` before the old files are gone: it would write its own
    into files this then unlinks.
    """
    if settings.metrics_dir is not None:
        for stale in settings.metrics_dir.glob("*.db"):  # an earlier run's files would be summed into this one's
            stale.unlink(missing_ok=True)
        yield
        return
    if workers == 1:
        yield  # one process: its own registry, no files
        return
    with tempfile.TemporaryDirectory(prefix="textbook-metrics-") as path:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
        yield


def _ingest(args: argparse.Namespace, settings: Settings) -> int:
    from tqdm import tqdm

    from textbook_chat.index import ingest
    from textbook_chat.index.engine import IndexLocked
    from textbook_chat.web.services import open_services

    if not args.path.is_dir():
        raise UsageError(f"{args.path}: no such folder")
    private.prepare_data_dir(settings.data_dir)
    bars: list[tqdm] = []

    def progress(total: int) -> ingest.Progress:
        bar = tqdm(total=total, unit="chunk", desc="embedding", disable=total == 0 or not sys.stderr.isatty())
        bars.append(bar)

        def advance(n: int) -> None:
            bar.update(n)

        return advance

    async def run() -> ingest.IngestReport:
        from textbook_chat.search import calibration
        from textbook_chat.search.retrieval import Retriever
        from textbook_chat.search.second_opinion import SecondOpinion

        light = settings.replace(database_url=None, redis_url=None)
        async with open_services(light, retrieval=True) as services:
            assert services.index is not None and services.embedder is not None
            report = await ingest.run(
                args.path,
                services.index,
                services.embedder,
                base_url=settings.book_base_url,
                force=args.force,
                dry_run=args.dry_run,
                progress=progress,
            )
            if not args.dry_run:
                opinion = SecondOpinion.load()
                try:
                    retriever = Retriever(services.index, services.embedder, second_opinion=opinion)
                    kept = await calibration.after_ingest(retriever, services.index, book_changed=report.changed)
                finally:
                    opinion.close()
                print(f"confidence calibration: {calibration.points(kept)}")
                if opinion.available:
                    print(f"second opinion: {opinion.thresholds.describe()}")
            return report

    try:
        report = asyncio.run(run())
    except IndexLocked as exc:
        raise UsageError(str(exc)) from None
    finally:
        for bar in bars:
            bar.close()
    for skipped in report.skipped:
        print(f"skipped {skipped.file_path}: {skipped.reason}")
    print(report.summary())
    return 0


@contextlib.asynccontextmanager
async def _built_index(settings: Settings) -> AsyncIterator[tuple[VectorIndex, Embedder]]:
    """The ingested index and its embedder, without the database or Redis; a usage error when nothing is there."""
    from textbook_chat.web.services import open_services

    async with open_services(settings.replace(database_url=None, redis_url=None), retrieval=True) as services:
        assert services.index is not None and services.embedder is not None
        if not await services.index.exists():
            raise UsageError(f"no index at {settings.qdrant_url or settings.qdrant_path}: run ingest first")
        yield services.index, services.embedder


def _calibrate(args: argparse.Namespace, settings: Settings) -> int:
    from textbook_chat.index.engine import IndexLocked
    from textbook_chat.search import calibration, confidence
    from textbook_chat.search.retrieval import Retriever
    from textbook_chat.search.second_opinion import SecondOpinion

    async def run() -> calibration.Derived:
        async with _built_index(settings) as (index, embedder):
            opinion = SecondOpinion.load()
            try:
                derived = await calibration.derive(Retriever(index, embedder, second_opinion=opinion), index)
            finally:
                opinion.close()
            await calibration.save(index, embedder, derived.calibration, "book", derived.thresholds)
            return derived

    try:
        derived = asyncio.run(run())
    except IndexLocked as exc:
        raise UsageError(str(exc)) from None
    print(calibration.report(derived, confidence.CALIBRATIONS[settings.embedder]))
    print("saved with the index; a running server uses it after a restart")
    return 0


def _migrate(args: argparse.Namespace, settings: Settings) -> int:
    from textbook_chat.store import migrate

    if not settings.database_url:
        raise UsageError(
            "DATABASE_URL is not set: nothing to migrate (the embedded Postgres migrates itself at start)."
        )
    try:
        if args.downgrade:
            migrate.downgrade(settings.database_url, args.to)
        else:
            migrate.upgrade(settings.database_url, args.to)
    except Exception as exc:  # alembic/SQLAlchemy raise many types; the operator needs one line
        raise UsageError(f"migration failed: {type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
    print(f"database at {'downgraded to' if args.downgrade else 'revision'} {args.to}")
    return 0


def _on_the_database(settings: Settings, run: Callable[[Settings], Coroutine[Any, Any, _T]], missing: str) -> _T:
    """``run`` on the database purge and report read: DATABASE_URL's, else the embedded one DATA_DIR holds (started
    for the command and stopped after, never created); ``missing`` is the error when there is neither. ``run``
    gets settings without Redis: these commands need none, and a stopped Redis must not fail them."""
    from textbook_chat.store import embedded_db

    with embedded_db.database(settings, create=False) as settings:
        if not settings.database_url:
            raise UsageError(missing)
        return asyncio.run(run(settings.replace(redis_url=None)))


def _purge(args: argparse.Namespace, settings: Settings) -> int:
    from textbook_chat.web.services import open_services

    days = args.days if args.days is not None else settings.session_retention_days
    if days < 1 or args.batch_size < 1:
        raise UsageError("--days and --batch-size must be at least 1")

    async def run(settings: Settings) -> int:
        from textbook_chat.index.embeddings import create_embedder
        from textbook_chat.reports import retention

        embedder = create_embedder(settings)  # the fold groups purged gap questions into topics by meaning
        try:
            async with open_services(settings) as services:
                assert services.store is not None

                async def fold(conn: Any, session_ids: list[Any]) -> None:
                    await retention.fold(conn, embedder, session_ids)

                return await services.store.purge(retention_days=days, batch_size=args.batch_size, before_delete=fold)
        finally:
            await embedder.aclose()

    deleted = _on_the_database(settings, run, "DATABASE_URL is not set: there is nothing to purge.")
    print(f"purged {deleted} session(s) idle for more than {days} day(s)")
    return 0


def _report(args: argparse.Namespace, settings: Settings) -> int:
    from textbook_chat.index.embeddings import create_embedder
    from textbook_chat.index.engine import IndexLocked
    from textbook_chat.reports import report, report_views
    from textbook_chat.reports.report import period_days as report_period
    from textbook_chat.search.retrieval import Retriever
    from textbook_chat.web.services import Services, open_services

    try:
        days = report_period(args.since)
    except ValueError as exc:
        raise UsageError(f"--since: {exc}") from None

    async def build(services: Services, embedder: Embedder, retriever: Retriever | None) -> report.Report:
        assert services.store is not None
        async with services.store.connection(timeout_s=_REPORT_TIMEOUT_S) as conn:
            return await report.build(
                conn, embedder, days=days, retention_days=settings.session_retention_days, retriever=retriever
            )

    async def run(settings: Settings) -> report.Report:
        try:
            async with open_services(settings, retrieval=True) as services:
                assert services.index is not None and services.embedder is not None
                exists = await services.index.exists()
                retriever = Retriever(services.index, services.embedder) if exists else None
                return await build(services, services.embedder, retriever)
        except IndexLocked:
            pass  # a running server holds the embedded index: the report goes on without the closest sections
        embedder = create_embedder(settings)
        try:
            async with open_services(settings) as services:
                return await build(services, embedder, None)
        finally:
            await embedder.aclose()

    missing = "DATABASE_URL is not set (and no embedded database in DATA_DIR): no questions to report."
    result = _on_the_database(settings, run, missing)
    print(report_views.text(result))
    if args.html is not None:
        _write_file(args.html, report_views.html(result))
        print(f"wrote {args.html}")
    if args.json is not None:
        _write_file(args.json, json.dumps(result.to_json(), indent=2, ensure_ascii=False))
        print(f"wrote {args.json}")
    return 0


def _write_file(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


def _eval(args: argparse.Namespace, settings: Settings) -> int:
    from textbook_chat.answer import facts
    from textbook_chat.answer.generation import offline_generator
    from textbook_chat.index.engine import IndexLocked
    from textbook_chat.search import calibration, conversations, evaluate
    from textbook_chat.search.retrieval import Retriever
    from textbook_chat.search.second_opinion import SecondOpinion

    if args.save and not args.calibrate:
        raise UsageError("--save keeps the calibration --calibrate derives: give both")
    conversational = conversations.is_conversation_set(args.questions)  # a conversation set, else questions
    try:
        sets = conversations.load(args.questions) if conversational else []
        questions = [] if conversational else evaluate.load_questions(args.questions)
    except (OSError, evaluate.QuestionFileError, conversations.ConversationFileError) as exc:
        raise UsageError(str(exc)) from None

    answers: list[facts.AnswerOutcome] = []
    turns: list[conversations.TurnOutcome] = []

    async def run() -> tuple[list[evaluate.Outcome], Retriever]:
        async with _built_index(settings) as (index, embedder):
            opinion = None
            if not args.no_second_opinion:
                opinion = SecondOpinion.load(await calibration.stored_thresholds(index, embedder))
            retriever = Retriever(index, embedder, await calibration.stored(index, embedder), opinion)
            # The offline answer orders its units with the second opinion's cross-encoder, as the server does.
            generator = offline_generator(opinion.encoder if opinion else None, wait_s=math.inf)
            try:
                if conversational:  # each turn's offline answer is the next turn's history, as in the server
                    turns.extend(await conversations.run(retriever, sets, facts.offline_answer(generator)))
                    return [], retriever
                outcomes = await evaluate.run(
                    retriever, questions, module_aware=args.module_aware, judge_all=args.calibrate
                )
                answers.extend(await facts.run(retriever, generator, questions, module_aware=args.module_aware))
                if args.save:
                    try:
                        print(await evaluate.save_calibration(index, embedder, retriever, outcomes))
                    except ValueError as exc:
                        raise UsageError(f"cannot calibrate: {exc}") from None
            finally:
                if opinion is not None:
                    opinion.close()
            return outcomes, retriever

    try:
        outcomes, retriever = asyncio.run(run())
    except IndexLocked as exc:
        raise UsageError(str(exc)) from None
    if conversational:
        print(conversations.table(turns, title=f"{args.questions} ({retriever.embedder.name} embedder)"))
        found = (facts.conversation_table(turns), conversations.misses(turns) if args.misses else "")
        print("\n".join(part for part in found if part))
        return 0
    figures = evaluate.figures(outcomes)
    title = f"{args.questions} ({retriever.embedder.name} embedder{', module-aware' if args.module_aware else ''})"
    print(evaluate.table(figures, title=title))
    if answers:
        print(facts.table(facts.figures(answers)))
    if args.calibrate:
        print(evaluate.calibration_report(outcomes, retriever.calibration))
        if retriever.second_opinion is not None and retriever.second_opinion.available:
            print(evaluate.opinion_report(outcomes, retriever.second_opinion.thresholds))
    if args.json is not None:
        report = evaluate.to_json(
            figures, outcomes, embedder=retriever.embedder.name, calibration=retriever.calibration
        )
        report["answers"] = facts.to_json(answers)
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if args.plot is not None:
        try:
            evaluate.plot(outcomes, retriever.calibration, args.plot, title=title)
        except evaluate.PlotUnavailable as exc:
            raise UsageError(str(exc)) from None
    return 0
