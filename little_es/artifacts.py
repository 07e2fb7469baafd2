"""Content-addressed artifacts: an artifact's reference together with its bytes.

Large step outputs and files a step produces are stored once, by the sha256 of
their bytes (an :class:`~little_es.backends.base.ArtifactStore` of the world's
backend), and events carry an :class:`~little_es.values.ArtifactRef`, the
manifest: which run and step produced the artifact and what its bytes must
hash to. Reading one back gives a :class:`HydratedArtifact`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from little_es.values import ArtifactRef


class HydratedArtifact(BaseModel):
    """An artifact's manifest together with its (verified) bytes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    manifest: ArtifactRef
    payload: bytes
