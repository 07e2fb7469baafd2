"""Step paths: construction, parsing, the inverse property and visit keys."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from little_es.errors import InvalidStepPathError, WorkflowDefinitionError
from little_es.workflow.paths import StepPathParts, parse_step_path, step_path, visit_key

step_ids = st.from_regex(r"\A[A-Za-z][A-Za-z0-9_-]{0,15}\Z")
branch_keys = st.from_regex(r"\A[A-Za-z0-9_.-]{1,16}\Z")
visits = st.integers(min_value=1, max_value=10_000)


@st.composite
def path_parts(draw: st.DrawFn) -> StepPathParts:
    in_branch = draw(st.booleans())
    return StepPathParts(
        step_id=draw(step_ids),
        visit=draw(visits),
        group_id=draw(step_ids) if in_branch else None,
        branch_key=draw(branch_keys) if in_branch else None,
        group_visit=draw(visits) if in_branch else 1,
    )


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"step_id": "review"}, "review"),
        ({"step_id": "review", "visit": 2}, "review@2"),
        ({"step_id": "lint", "group_id": "check", "branch_key": "a.py"}, "check[a.py]/lint"),
        (
            {"step_id": "lint", "group_id": "check", "branch_key": "a.py", "group_visit": 2},
            "check@2[a.py]/lint",
        ),
        (
            {"step_id": "lint", "visit": 3, "group_id": "g", "branch_key": "0", "group_visit": 12},
            "g@12[0]/lint@3",
        ),
    ],
)
def test_documented_examples(kwargs: dict[str, object], expected: str) -> None:
    assert step_path(**kwargs) == expected  # type: ignore[arg-type]
    assert parse_step_path(expected) == StepPathParts.model_validate(kwargs)


@given(path_parts())
def test_parts_to_path_to_parts(parts: StepPathParts) -> None:
    assert parse_step_path(parts.path) == parts


@given(path_parts())
def test_path_to_parts_to_path(parts: StepPathParts) -> None:
    path = parts.path
    assert parse_step_path(path).path == path


@given(st.text(alphabet="ab1_-.[]/@0", max_size=20))
def test_any_string_that_parses_is_canonical(text: str) -> None:
    # One path per step execution: whatever parses re-spells to exactly itself.
    try:
        parts = parse_step_path(text)
    except InvalidStepPathError:
        return
    assert parts.path == text


@given(path_parts(), path_parts())
def test_distinct_parts_give_distinct_paths(a: StepPathParts, b: StepPathParts) -> None:
    assert (a.path == b.path) == (a == b)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "review@1",  # the first visit is written without @1
        "review@0",
        "review@02",
        "review@",
        "review@-2",
        "1review",
        "re view",
        "review\n",
        "check[a.py]",
        "check[]/lint",
        "check[a/b]/lint",
        "[a]/lint",
        "check@1[a]/lint",
        "check[a]/lint/x",
        "check[a]/inner[b]/lint",
        "check[a b]/lint",
        "/lint",
        "lint/",
    ],
)
def test_malformed_paths_are_refused(bad: str) -> None:
    with pytest.raises(InvalidStepPathError):
        parse_step_path(bad)


def test_invalid_step_path_error_is_a_definition_and_value_error() -> None:
    with pytest.raises(WorkflowDefinitionError):
        parse_step_path("a@1")
    with pytest.raises(ValueError, match="without '@1'"):
        parse_step_path("a@1")


def test_non_string_path_is_refused() -> None:
    with pytest.raises(InvalidStepPathError, match="must be a string"):
        parse_step_path(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"step_id": "a/b"}, "not a valid step id"),
        ({"step_id": "a", "visit": 0}, "visit must be an integer >= 1"),
        ({"step_id": "a", "visit": True}, "visit must be an integer >= 1"),
        ({"step_id": "a", "group_visit": 2}, "leave group_visit at 1"),
        ({"step_id": "a", "group_id": "g"}, "go together"),
        ({"step_id": "a", "branch_key": "k"}, "go together"),
        ({"step_id": "a", "group_id": "g", "branch_key": "a b"}, "branch key"),
        ({"step_id": "a", "group_id": "g", "branch_key": ""}, "branch key"),
        ({"step_id": "a", "group_id": "g[x]", "branch_key": "k"}, "group id"),
    ],
)
def test_step_path_refuses_unspellable_parts(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidStepPathError, match=message):
        step_path(**kwargs)  # type: ignore[arg-type]


def test_parts_refuse_inconsistent_fields() -> None:
    with pytest.raises(ValueError, match="go together"):
        StepPathParts(step_id="a", group_id="g")


def test_parts_are_frozen() -> None:
    parts = parse_step_path("review@2")
    with pytest.raises(ValueError, match="frozen"):
        parts.visit = 3  # type: ignore[misc]


def test_visit_key_drops_visit_counters() -> None:
    assert visit_key("review") == ("review", "")
    assert visit_key("review@3") == ("review", "")
    assert visit_key("check[a.py]/lint") == ("lint", "check[a.py]")
    assert visit_key("check@2[a.py]/lint") == ("lint", "check[a.py]")
    assert visit_key("check[b.py]/lint") != visit_key("check[a.py]/lint")
    assert visit_key("lint") != visit_key("check[a.py]/lint")


@given(path_parts())
def test_visit_key_is_shared_by_every_visit(parts: StepPathParts) -> None:
    first = parts.model_copy(update={"visit": 1, "group_visit": 1})
    assert visit_key(parts.path) == visit_key(first.path)
    assert visit_key(parts.path) == (parts.step_id, parts.branch_path)
