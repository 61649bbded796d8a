"""Which words the book uses, read on the demo book's real index: forms, compounds written another way, the share
of a question's words the book never uses, and names of several words its passages never write together."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import copy_index
from textbook_chat.core.settings import Settings
from textbook_chat.index import sparse
from textbook_chat.index.vectors import Hit
from textbook_chat.search.rerank import Candidate, Query
from textbook_chat.search.vocabulary import BookWords, unwritten_compounds
from textbook_chat.web.services import open_services


@pytest.fixture(scope="module")
async def words(demo_index_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[BookWords]:
    data = copy_index(demo_index_dir, tmp_path_factory.mktemp("vocabulary") / "data")
    async with open_services(Settings.from_env({"DATA_DIR": str(data), "EMBEDDER": "local"}), retrieval=True) as s:
        assert s.index is not None
        yield BookWords(s.index)


async def test_a_term_is_the_books_when_the_passages_or_the_index_hold_it(words: BookWords) -> None:
    (term,) = sparse.terms("humanoids")  # terms come normalised, as the index holds them
    assert await words.uses(term, frozenset())
    assert not await words.uses("pasta", frozenset())
    assert await words.uses("pasta", frozenset({"pasta"}))  # the retrieved passages are read first


async def test_a_hyphenated_term_is_the_books_where_each_part_is(words: BookWords) -> None:
    assert await words.uses("zero-moment", frozenset())  # "Zero Moment Point", written with a hyphen
    assert not await words.uses("micro-ros", frozenset())  # "micro" is nowhere in the book
    assert not await words.uses("cherry-pick", frozenset())


async def test_a_command_line_option_is_the_books_only_where_it_is_written_whole(words: BookWords) -> None:
    """ "--zero-moment" is no option the book documents, though "zero-moment" is its compound written another way."""
    question = Query("How do I pass --zero-moment to the balance controller?")
    assert "zero-moment" in question.names
    assert await words.unknown(question, []) == ("zero-moment",)
    assert await words.unknown(Query("How is the zero-moment point computed?"), []) == ()


async def test_the_share_of_a_questions_words_the_book_never_uses(words: BookWords) -> None:
    assert await words.absent_share("How does a humanoid keep its balance?", []) == 0.0
    assert await words.absent_share("How do I cook pasta al dente?", []) >= 0.5


async def test_a_word_the_passages_write_only_inside_an_identifier_is_the_books(words: BookWords) -> None:
    # "debounce" is nowhere in the demo book; a passage calling debounceTime() uses it
    code = "fromEvent(box, 'input').pipe(debounceTime(300), switchMap(fetchResults)).subscribe(showResult)"
    assert not await words.uses("debounce", frozenset())
    passage = Candidate(Hit("c1", 1.0, 0.5, {"text": code}), 0.5, terms=frozenset(sparse.terms(code)))
    question = Query("How do I debounce the keystrokes of a search box?")
    assert "debounce" in await words.unknown(question, [])
    assert "debounce" not in await words.unknown(question, [passage])
    assert await words.absent_share("How do I debounce keystrokes?", [code]) == 0.5  # "keystrokes" is nowhere


def test_a_name_of_several_words_the_passages_never_write_together_is_unwritten() -> None:
    """A book of "Microsoft Outlook" and "teams" says nothing of Microsoft Teams; a name it writes together, in
    any spacing, case or Markdown, is its own; a compound holding a word the book never uses is the names rule's."""
    passages = [
        "Sync with **Microsoft** Outlook calendars.",
        "Breakout rooms let teams split up.",
        "Use Let's Encrypt.",
    ]
    asked = "Does Microsoft Teams offer this, like Microsoft Outlook and Let's Encrypt do?"
    assert unwritten_compounds(asked, passages, unknown=()) == ["microsoft teams"]
    assert unwritten_compounds("Is the Zoom Video SDK the same?", passages, unknown=("zoom",)) == []
    assert unwritten_compounds("How do I start a meeting?", passages, unknown=()) == []
