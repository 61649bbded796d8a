"""The keyword side of hybrid search: terms, names, BM25 vectors and the in-memory keyword index."""

from __future__ import annotations

import pytest

from textbook_chat.index.sparse import (
    KeywordIndex,
    clipped,
    compound_names,
    content,
    document_vector,
    forms,
    inner_words,
    names,
    options,
    query_vector,
    specific,
    specificity,
    telling,
    term_index,
    terms,
)


def test_identifiers_are_kept_whole_and_split_into_parts() -> None:
    assert terms("Call rclpy.spin() on ros2_control") == [
        "call",
        "rclpy.spin",
        "rclpy",
        "spin",
        "ros2_control",
        "ros2",
        "control",
    ]


def test_a_compound_written_with_a_typographic_hyphen_is_the_compound_written_with_a_hyphen() -> None:
    assert terms("Teacher–Student training") == ["teacher-student", "teacher", "student", "training"]
    assert terms("a non\u2011linear model") == terms("a non-linear model")
    assert terms("sim—real") == ["sim", "real"]  # an em dash sets off a clause: no compound


def test_stopwords_and_single_letters_are_dropped_and_plurals_folded() -> None:
    assert terms("What are the topics and policies of a robot?") == ["topic", "policy", "robot"]
    assert terms("the status of this bus") == ["status", "bus"]  # -us and -ss words keep their s


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("How do I set up MoveIt 2 on an ESP32?", ["moveit", "esp32"]),
        ("How do I connect EtherCAT servo drives to ros2_control?", ["ethercat", "ros2_control"]),
        ("How do I flash micro-ROS firmware?", ["micro-ros"]),
        ("What does rclpy.spin() actually do?", ["rclpy.spin"]),
        ("How much does a Tesla Optimus robot cost?", ["tesla", "optimus"]),
        ("What is a good old-fashioned approach to two-link legs?", []),  # ordinary compounds are not names
        ("Where did ROS come from, and why ROS 2?", ["ros"]),
        ("What is a series elastic actuator?", []),
        ("What is a ROS 2 topic? (case 17)", ["ros"]),  # bare numbers are quantities, not names
        ("How does Physical AI differ from traditional AI? Thanks!", ["physical", "ai"]),  # a sentence's capital
        ("Explain PID tuning. Also, what does Ziegler suggest?", ["pid", "ziegler"]),
        ("Which ROS release came out in 2022, and is Python 3.10 supported?", ["ros", "python"]),
        ("Why use a Teacher–Student scheme?", ["teacher-student"]),  # an en dash joins as a hyphen does
        ("WHY USE A TEACHER-STUDENT SCHEME FOR LOCOMOTION POLICIES?", []),  # caps lock: capitals say nothing
        ("HOW DO I SET UP ROS2_CONTROL ON AN ESP32?", ["ros2_control", "esp32"]),  # digits and _ still do
        ("How does the scan operator keep a running total?", ["scan"]),  # a word named by its kind in code
        ("Which flags does the chmod command take?", ["chmod"]),
        ("What does the main function do, and is it the best method?", []),  # what kind of question, not a name
        ("Steps:\n- Set gravity\n- Simple worlds in Gazebo", ["gazebo"]),  # a list item's first word is grammar
        ("Steps:\n\n“Setup” comes first.", []),  # ... and a line's opening quotation
        ("How do I run kube-hunter in active mode?", ["kube-hunter"]),  # a part rare in English: a tool's name
        ("How do I cherry-pick a commit, step-by-step?", []),  # ... compounds of common words are not
    ],
)
def test_names_are_identifiers_and_capitalised_words_after_the_first(question: str, expected: list[str]) -> None:
    assert names(question) == expected


def test_term_ids_are_stable_across_processes() -> None:
    assert term_index("gazebo") == 0xF12684C9  # blake2b, never Python's per-process hash()
    assert term_index("gazebo") != term_index("gazebos")
    assert 0 <= term_index("anything") < 2**32


def test_document_vectors_saturate_repeated_terms_and_queries_weigh_terms_equally() -> None:
    once = document_vector("gazebo")
    many = document_vector("gazebo " * 50)
    assert (
        max(once.values) < max(many.values) <= 2.2
    )  # BM25 saturation: never above k1 + 1  # BM25 saturation: (k1 + 1) at most
    query = query_vector("gazebo physics gazebo")
    assert len(query.indices) == 2 and set(query.values) == {1.0}
    assert list(query.indices) == sorted(query.indices)


def test_the_keyword_index_ranks_rare_matching_terms_first() -> None:
    index = KeywordIndex(
        [
            "the robot walks and the robot balances",
            "gazebo simulates the robot physics",
            "robot robot robot",
            "nothing relevant here at all",
        ]
    )
    scores = index.scores(terms("gazebo robot"))
    assert int(scores.argmax()) == 1  # "gazebo" is rare, so it outweighs repeated "robot"
    assert scores[3] == 0.0
    assert "gazebo" in index and "moveit" not in index
    assert index.scores(terms("moveit")).sum() == 0.0


def test_a_negated_auxiliary_is_not_a_content_word() -> None:
    """ "aren't" would leave "aren", a word no book uses: a follow-up would lose evidence for it."""
    assert content("What does it report when the frames aren't connected and don't move?") == [
        "report",
        "frame",
        "connected",
        "move",
    ]


def test_function_words_and_a_compounds_whole_are_not_content_words() -> None:
    assert content("How do I get a copy of it onto my laptop?") == ["copy", "laptop"]
    assert content("Is there a ready-made one I can adopt?") == ["ready", "made", "adopt"]
    assert content("What other hardware does the course need besides it?") == ["hardware", "course"]


def test_a_clipped_form_is_a_rare_word_the_book_spells_out() -> None:
    vocabulary = {"authorization", "configuration", "tournament", "nested"}
    assert clipped("auth", vocabulary) and clipped("config", vocabulary)
    assert not clipped("tour", vocabulary)  # a common English word is its own word, not a clipping
    assert not clipped("auth", {"author"})  # too little is cut to be a clipping
    assert not clipped("authorization", vocabulary)  # the word itself is not its own clipping


def test_a_name_written_without_its_separators_is_one_of_its_forms() -> None:
    assert "socketio" in forms("socket.io") and "ros2control" in forms("ros2_control")
    assert forms("robot") == ["robot"]


def test_an_unknown_term_tells_when_it_is_an_identifier_or_rare_not_a_compound_of_common_words() -> None:
    assert telling("ros2_control") and telling("rclpy.spin") and telling("strace") and telling("urdf-based")
    assert not telling("back-to-back") and not telling("step-by-step") and not telling("drop")


def test_an_absent_word_says_less_of_another_subject_the_more_common_it_is_in_english() -> None:
    """An identifier or a rare word tells fully; an everyday word ("put", "wall") is how a reader asks, and says
    less than a word of its own subject ("pasta") does."""
    assert specificity("rclpy.spin") == specificity("strace") == 1.0
    assert specificity("put") < specificity("wall") < specificity("cook") < specificity("pasta") < 1.0
    assert specificity("the") == 0.0


def test_a_long_command_line_option_is_a_name_and_is_read_whole() -> None:
    question = "Which rules go in the API server's --audit-policy-file, and does certbot renew --dry-run help?"
    assert options(question) == ["audit-policy-file", "dry-run"]
    assert {"audit-policy-file", "dry-run"} <= set(names(question))
    assert options("a--b, ---x and --p are no options; nor is a dash-separated word") == []


def test_a_derived_word_has_the_word_it_is_made_from_among_its_forms() -> None:
    """ "viewable" is rare in English, but a book that says "view" answers about it: no specific term."""
    assert "view" in forms("viewable") and "break" in forms("breakage") and "exploit" in forms("exploitable")
    assert not specific("viewable") and not specific("breakage") and specific("strace")
    assert forms("usable") == ["usable"]  # "us" is too short a stem to be a word's base


def test_a_prefixed_derivative_of_a_common_word_is_no_specific_term_nor_the_word_itself() -> None:
    """ "overexposed" is not in wordfreq's small list, but it is English made of "exposed": a reader's paraphrase, not
    a tool the book never names. A book that says "exposed" still does not say "overexposed" (not one of its forms),
    and names made without a prefix stay specific."""
    assert not specific("overexposed") and not specific("misconfigured") and not specific("preinstalled")
    assert "exposed" not in forms("overexposed")
    assert specific("certbot") and specific("strace") and specific("useinbandfec") and specific("unmute")


def test_a_name_of_several_words_is_read_whole_too() -> None:
    """Runs of adjacent name words: "Microsoft Teams" is one thing, not Microsoft and teams."""
    assert compound_names("Does Microsoft Teams offer the same as the Zoom Video SDK?") == [
        "microsoft teams",
        "zoom video sdk",
    ]
    assert compound_names("How do I install ROS 2 Humble on Ubuntu?") == []  # a number breaks a run
    assert compound_names("What is Gazebo? And Isaac Sim?") == ["isaac sim"]  # "And" opens a sentence: no name


def test_the_words_inside_camel_case_identifiers_are_read_apart() -> None:
    assert inner_words("fromEvent(input).subscribe(showSearchResult)") == {"from", "event", "show", "search", "result"}
    assert inner_words("new HttpClient(); BehaviorSubject") == {"http", "client", "behavior", "subject"}
    # Words, acronyms, capitalised words and snake_case (which ``terms`` already splits) hold no inner capital
    assert inner_words("Gazebo URDF ros2_control shows the robot") == frozenset()
