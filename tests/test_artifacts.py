"""Content-addressed artifacts on every backend: addressing, verification, refusals."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import pytest
from pydantic import ValidationError

from little_es.errors import ArtifactIntegrityError, ArtifactNotFoundError
from little_es.values import ArtifactRef, HydratedArtifact
from little_es.world import World

if TYPE_CHECKING:
    from conftest import WorldSpec


def _ref(data: bytes, **overrides: Any) -> ArtifactRef:
    sha = hashlib.sha256(data).hexdigest()
    fields: dict[str, Any] = {
        "artifact_id": f"sha256:{sha}",
        "sha256": sha,
        "size": len(data),
        "run_id": "run_art",
        "step_path": "s",
    }
    return ArtifactRef(**{**fields, **overrides})


@pytest.mark.parametrize(
    "data", [b"", b"x", bytes(range(256)) * 16, b"\x00" * (4 * 1024 * 1024 + 3)], ids=len
)
def test_bytes_round_trip_exactly(world: World, data: bytes) -> None:
    ref = world.artifacts.put(data, run_id="run_art", step_path="s")
    assert ref == _ref(data)
    got = world.artifacts.get(ref)
    assert isinstance(got, HydratedArtifact)
    assert got.payload == data and isinstance(got.payload, bytes)


@pytest.mark.parametrize("wrap", [bytearray, memoryview], ids=lambda t: t.__name__)
def test_bytes_like_data_is_accepted(world: World, wrap: Any) -> None:
    ref = world.artifacts.put(wrap(b"abc"), run_id="run_art", step_path="s")
    assert world.artifacts.get(ref).payload == b"abc"


@pytest.mark.parametrize("data", ["text", 5, None, [1]], ids=repr)
def test_non_bytes_data_is_refused(world: World, data: Any) -> None:
    with pytest.raises(TypeError, match="artifact data must be bytes"):
        world.artifacts.put(data, run_id="run_art", step_path="s")


def test_same_bytes_are_stored_once(world: World, world_spec: WorldSpec) -> None:
    a = world.artifacts.put(b"shared", run_id="run_a", step_path="x")
    b = world.artifacts.put(b"shared", run_id="run_b", step_path="y", media_type="text/plain")
    assert a.sha256 == b.sha256 and a.artifact_id == b.artifact_id
    assert (b.run_id, b.step_path, b.media_type) == ("run_b", "y", "text/plain")
    assert world.artifacts.get(a).payload == world.artifacts.get(b).payload == b"shared"
    if world_spec.backend == "sqlite":
        assert world_spec.data_dir is not None
        files = [p for p in (world_spec.data_dir / "artifacts").rglob("*") if p.is_file()]
        assert files == [world_spec.data_dir / "artifacts" / a.sha256[:2] / a.sha256]
    elif world_spec.backend == "postgres":
        with world_spec.connect_postgres() as conn:
            rows = conn.execute("SELECT sha256 FROM little_es_artifacts").fetchall()
        assert rows == [(a.sha256,)]
    elif world_spec.backend == "mariadb":
        with world_spec.connect_mysql() as conn, conn.cursor() as cur:
            cur.execute("SELECT sha256, chunk FROM little_es_artifacts")
            assert cur.fetchall() == ((a.sha256, 0),)


def test_size_disagreeing_with_the_record_is_refused(world: World) -> None:
    real = world.artifacts.put(b"twelve bytes", run_id="run_art", step_path="s")
    lying = real.model_copy(update={"size": real.size + 1})
    with pytest.raises(ArtifactIntegrityError, match="corrupt"):
        world.artifacts.get(lying)


def test_ref_naming_other_bytes_is_refused(world: World) -> None:
    world.artifacts.put(b"stored", run_id="run_art", step_path="s")
    with pytest.raises(ArtifactNotFoundError, match="restore it from a backup"):
        world.artifacts.get(_ref(b"other"))


def test_a_forged_ref_cannot_reach_outside_the_store(world: World, world_spec: WorldSpec) -> None:
    # model_construct skips validation, as a ref forged in memory would.
    forged = ArtifactRef.model_construct(
        artifact_id="sha256:../../etc/passwd",
        sha256="../../../../etc/passwd",
        size=0,
        media_type="text/plain",
        run_id="run_art",
        step_path="s",
    )
    if world_spec.backend == "sqlite":
        with pytest.raises(ValueError, match="not a sha256 hex digest"):
            world.artifacts.get(forged)
    else:
        with pytest.raises(ArtifactNotFoundError):
            world.artifacts.get(forged)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"sha256": "ABC"}, "sha256"),
        ({"sha256": "0" * 63}, "sha256"),
        ({"size": -1}, "size"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_invalid_refs_are_refused(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        _ref(b"x", **overrides)


def test_refs_and_hydrated_artifacts_are_frozen(world: World) -> None:
    ref = world.artifacts.put(b"x", run_id="run_art", step_path="s")
    with pytest.raises(ValidationError):
        ref.size = 2  # type: ignore[misc]
    with pytest.raises(ValidationError):
        world.artifacts.get(ref).payload = b"y"  # type: ignore[misc]


@pytest.mark.backends("sqlite")
def test_file_store_leaves_no_temporary_files(world: World, world_spec: WorldSpec) -> None:
    refs = [
        world.artifacts.put(bytes([i]) * 10, run_id="run_art", step_path="s") for i in range(20)
    ]
    assert world_spec.data_dir is not None
    names = {p.name for p in (world_spec.data_dir / "artifacts").rglob("*") if p.is_file()}
    assert names == {r.sha256 for r in refs}


@pytest.mark.backends("postgres")
def test_postgres_blobs_live_in_the_worlds_schema(world: World, world_spec: WorldSpec) -> None:
    ref = world.artifacts.put(b"in my schema", run_id="run_art", step_path="s")
    with world_spec.connect_postgres() as conn:
        row = conn.execute(
            "SELECT table_schema FROM information_schema.tables"
            " WHERE table_name = 'little_es_artifacts'"
            " AND table_schema = %s",
            (world_spec.schema,),
        ).fetchone()
        assert row == (world_spec.schema,)
        stored = conn.execute(
            "SELECT data FROM little_es_artifacts WHERE sha256 = %s", (ref.sha256,)
        ).fetchone()
    assert stored is not None and isinstance(stored[0], bytes) and stored[0] == b"in my schema"
