"""How a question is read in its conversation (``search/context.py``): which questions take the earlier subject,
what the standalone form holds, and how the two readings' candidates are fused."""

from __future__ import annotations

from dataclasses import replace

from textbook_chat.index import sparse
from textbook_chat.index.vectors import Hit
from textbook_chat.search import context
from textbook_chat.search.context import Earlier
from textbook_chat.search.rerank import Candidate

GAZEBO = [Earlier("What is Gazebo Harmonic?")]


def test_a_first_question_is_read_as_asked() -> None:
    asked = context.read("How do I install it?", [])
    assert asked.standalone is None and not asked.in_context


def test_a_pronoun_takes_the_subject_of_the_question_before() -> None:
    asked = context.read("How do I install it?", GAZEBO)
    assert asked.standalone == "How do I install it? (Gazebo Harmonic)"
    assert asked.context_weight > asked.alone_weight and asked.own_terms == ("install",)


def test_an_ellipsis_takes_the_subject_too() -> None:
    asked = context.read("And actions?", [Earlier("What are services in ROS 2?")])
    assert asked.standalone == "And actions? (services ROS 2)"


def test_also_adds_to_the_subject_before() -> None:
    """ "What if I also want to record meetings?" asks for more of the last subject (the server's hardware), not a
    new one: read in context outright, not only as a fallback."""
    asked = context.read("What if I also want to record meetings?", [Earlier("What hardware does a server need?")])
    assert asked.in_context and not asked.fallback
    assert asked.standalone == "What if I also want to record meetings? (hardware server)"


def test_a_question_naming_its_own_subject_takes_no_context() -> None:
    """A topic switch is never drowned by the topic before it: it is read exactly as a first question is."""
    switches = ("What is the Zero Moment Point?", "How do I implement a service client in ROS 2?", "What is DDS?")
    for switch in switches:
        assert context.read(switch, GAZEBO) == context.read(switch, [])


def test_a_question_of_one_content_word_takes_the_subject() -> None:
    asked = context.read("Any prerequisites?", [Earlier("What is the Module 2 assignment?")])
    assert asked.standalone == "Any prerequisites? (Module 2 assignment)" and asked.in_context


def test_common_words_without_a_pointing_word_are_read_in_context_only_as_a_fallback() -> None:
    """ "What is the capture point?" after a question about topics is a switch in common words: searched alone,
    and in context only when the book answers it weakly alone (``Retriever.retrieve``)."""
    asked = context.read("What is the capture point?", [Earlier("What is a ROS 2 topic?")])
    assert asked.fallback and not asked.in_context
    fallback = asked.contextual()
    assert fallback.in_context and fallback.context_weight == fallback.alone_weight
    assert fallback.standalone == "What is the capture point? (ROS 2 topic)"


def test_the_subject_carries_through_a_third_turn_from_the_standalone_form_before() -> None:
    """The second turn's standalone form holds the first subject, so "its" in the third still finds it."""
    second = context.read("How do I install it?", GAZEBO)
    third = context.read(
        "And what are its system requirements?", [*GAZEBO, Earlier(second.question, second.standalone)]
    )
    assert third.standalone is not None and "Gazebo Harmonic" in third.standalone and "install" in third.standalone


def test_the_best_passage_of_the_question_alone_keeps_a_place_among_the_sources() -> None:
    """Where the earlier subject outweighs the question's own words (it moved to another page), what the words
    alone found best is still among the sources kept: last, unless the fusion ranked it higher."""

    def candidate(point: str) -> Candidate:
        return Candidate(Hit(id=point, fused_score=0.0, dense_score=0.5, payload={}), 0.5, 0.5)

    asked = context.read("If that number is low, how do I make their first days smoother?", [Earlier("What is churn?")])
    alone = [candidate("onboarding"), *(candidate(f"churn-{i}") for i in range(5, 9))]
    in_context = [candidate(f"churn-{i}") for i in range(8)]
    fused = [c.hit.id for c in context.fuse(alone, in_context, asked, keep=5)]
    assert fused[:5] == ["churn-5", "churn-6", "churn-7", "churn-0", "onboarding"]
    assert len(fused) == 10  # nothing dropped


def test_the_subject_carried_forward_is_bounded_and_newest_first() -> None:
    long = Earlier("How do simulators model contact friction damping stiffness restitution and solver iterations?")
    asked = context.read("Why does it matter?", [long])
    assert asked.standalone is not None
    subject = asked.standalone.removeprefix("Why does it matter? (").removesuffix(")").split()
    assert len(subject) == context.SUBJECT_WORDS and subject[0] == "simulators"


def test_fusion_ranks_what_both_readings_found_first_and_keeps_the_higher_relevance() -> None:
    def candidate(point: str, relevance: float) -> Candidate:
        return Candidate(Hit(id=point, fused_score=0.0, dense_score=relevance, payload={}), relevance, relevance)

    alone = [candidate("install-ros", 0.6), candidate("gazebo-install", 0.4)]
    in_context = [candidate("gazebo-install", 0.7), candidate("gazebo-intro", 0.65)]
    asked = context.read("How do I install it?", GAZEBO)
    fused = context.fuse(alone, in_context, asked, keep=5)
    assert [c.hit.id for c in fused][0] == "gazebo-install"
    assert fused[0].relevance == 0.7
    assert {c.hit.id for c in fused} == {"install-ros", "gazebo-install", "gazebo-intro"}


def test_the_reading_in_context_blends_the_earlier_questions_as_asked() -> None:
    """The earlier questions' vectors in its blend are those computed when they were asked (in the query cache):
    the last one and those it took context from, as asked; only the question and its standalone form are new."""
    second = context.read("How do I install it?", GAZEBO)
    assert second.prior == ("What is Gazebo Harmonic?",)
    session = [*GAZEBO, Earlier(second.question, second.standalone)]
    third = context.read("And what are its system requirements?", session)
    assert third.prior == ("What is Gazebo Harmonic?", "How do I install it?")
    after_a_switch = context.read("How do I install it?", [*GAZEBO, Earlier("What is DDS?")])
    assert after_a_switch.prior == ("What is DDS?",)  # the switch took no context: the older subject is not blended


def test_the_reading_in_context_is_embedded_with_what_the_cited_sections_call_the_subject() -> None:
    """The headings of the sections the last answer cited name the thing a follow-up points back to; the rest of
    the earlier question's words are how it asked about it. The vector in context reads the named part (a number
    after a kept word stays: "ROS 2"); the standalone form kept and reported, and the keyword side, hold it all."""
    headings = context.section_headings([("Secure domain", ("Prosody", "Jicofo")), ("ROS 2 setup", ())])
    assert headings == "Secure domain › Prosody › Jicofo\nROS 2 setup"
    earlier = [Earlier("How do I set up a secure domain for ROS 2 rooms?", answer="Edit it [1].", headings=headings)]
    asked = context.read("How do I add an account for it?", earlier)
    assert asked.standalone == "How do I add an account for it? (set secure domain ROS 2 rooms)"
    assert asked.focused == "How do I add an account for it? (secure domain ROS 2)"
    assert asked.subject == "set secure domain ROS 2 rooms"
    no_headings = context.read("How do I add an account for it?", [replace(earlier[0], headings="")])
    every_word = replace(earlier[0], headings="Set up › Secure domain › ROS rooms")
    all_named = context.read("How do I add an account for it?", [every_word])
    assert no_headings.focused is None and no_headings.standalone == asked.standalone
    assert all_named.focused is None and all_named.standalone == asked.standalone  # nothing to focus on


def test_the_blend_leans_to_the_question_and_keeps_the_earlier_subject() -> None:
    question, earlier = [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]
    blended = context.blend(question, [earlier])
    assert abs(sum(x * x for x in blended) - 1.0) < 1e-9  # a unit vector, as the index's are
    assert blended[0] > blended[1] > 0.0 and blended[2] == 0.0
    assert context.blend(question, []) == question


def test_the_standalone_forms_own_vector_leads_the_reading_in_context() -> None:
    """Embedded, the standalone form reads the subject with the question's words, as a hand rewrite does: its
    vector outweighs the blend of the question's and the earlier questions', which still steers."""
    question, earlier, standalone = [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]
    reading = context.blend(question, [earlier], standalone)
    assert abs(sum(x * x for x in reading) - 1.0) < 1e-9
    assert reading[2] > reading[0] > reading[1] > 0.0
    assert context.blend(question, [earlier], ()) == context.blend(question, [earlier])


def test_the_reading_alone_weighs_by_how_well_the_book_answers_it_alone() -> None:
    """A follow-up whose own words find stronger passages alone than in context has moved on: its reading alone
    gains weight (up to the reading in context's); one whose words alone find weaker passages leans on context."""

    def found(relevance: float) -> list[Candidate]:
        return [Candidate(Hit(id="p", fused_score=0.0, dense_score=relevance, payload={}), relevance, relevance)]

    asked = context.read("How do I install it?", GAZEBO)
    weaker_alone = context.alone_weight(asked, found(0.4), found(0.8))
    stronger_alone = context.alone_weight(asked, found(0.9), found(0.6))
    assert weaker_alone < asked.alone_weight < stronger_alone <= asked.context_weight
    assert context.alone_weight(asked, found(0.5), []) == asked.alone_weight


def test_the_keyword_query_in_context_weighs_the_subject_it_took_below_the_questions_own_words() -> None:
    asked = context.read("How do I install it?", GAZEBO)
    assert asked.subject == "Gazebo Harmonic"
    query = context.keywords(asked)
    weight = dict(zip(query.indices, query.values, strict=True))
    install, gazebo = (sparse.term_index(t) for t in ("install", "gazebo"))
    assert weight[install] == 1.0 and weight[gazebo] == context.PRIOR_WEIGHT < 1.0


def test_the_last_answers_names_add_what_the_subject_lacks() -> None:
    """ "The other one" may point into the last answer: its names used at least twice join the subject, unless the
    subject already holds them or all of their words ("ROS/ROS" after "Isaac ROS")."""
    answer = (
        "Isaac ROS extends the ROS/ROS 2 ecosystem [1]. Bridges connect the ROS/ROS 2 world to CUDA, and CUDA "
        "kernels run on the Jetson; the Jetson Orin is the usual target [2].\n- Setup first\n- Setup again"
    )
    asked = context.read("How do I set it up?", [Earlier("What is Isaac ROS?", answer=answer)])
    assert asked.subject == "Isaac ROS CUDA Jetson"


def test_the_identifiers_of_a_listing_the_last_answer_quoted_are_not_its_names() -> None:
    """A quoted listing says ``model_name`` and ``self.models`` over and over; what the answer talks about is in its
    prose."""
    listing = "```python\nmodel_name = load(model_name)\nself.models[model_name] = optimized_model\n```"
    answer = f"Models are deployed on the Jetson Orin with TensorRT; the Jetson runs them [1].\n\n{listing}\n\n[1]"
    asked = context.read("What else does it need?", [Earlier("How are models deployed?", answer=answer)])
    assert asked.subject == "models deployed Jetson"


def test_words_that_point_back_are_never_the_subject() -> None:
    """ "Which ones are notable?" took its subject from the question before; the question after it takes that
    subject and the second question's own words, not the "ones" that pointed back."""
    first = [Earlier("What is a vision-language-action model?")]
    second = context.read("Which ones are notable?", first)
    third = context.read(
        "Where do they sit in the software stack?", [*first, Earlier(second.question, second.standalone)]
    )
    assert third.subject == "notable vision-language-action model"
    assert context.read("How do I check mine for errors?", [Earlier("What is URDF?")]).in_context  # "mine" points


def test_the_standalone_form_is_the_question_with_its_subject_in_brackets() -> None:
    standalone = context.expanded(" How do I install it? ", "Gazebo Harmonic")
    assert standalone == "How do I install it? (Gazebo Harmonic)"
    assert context.is_expanded("How do I install it?", standalone)
    assert not context.is_expanded("How do I install it?", "How do I install Gazebo Harmonic?")  # a rewrite
    assert not context.is_expanded("How do I install it?", None)
